# The GPU backend built for AMD GPUs (EMBSCALE_HIP=ON): the CUDA sources of src/ compiled by hipcc as HIP,
# with src/core/hip/include on their include path (the CUDA runtime and CUB names mapped onto HIP and
# rocPRIM), into the same library as the CPU backend. Each source is one custom command, so any hipcc
# works (CMake's HIP language wants a ROCm layout that Debian's packages do not have). The build's lane
# count (EMBSCALE_HIP_LANES) is the wavefront size of its targets, shared by host and device code, so
# the targets of one build must agree on it. The target embscale_hip_objects compiles the backend alone
# (what CI runs: scripts/ci_hip_compile.sh).
find_program(EMBSCALE_HIPCC hipcc REQUIRED)
find_path(EMBSCALE_ROCPRIM_INCLUDE rocprim/rocprim.hpp PATHS /opt/rocm/include)
if(NOT EMBSCALE_ROCPRIM_INCLUDE)
  message(FATAL_ERROR "EMBSCALE_HIP=ON needs rocPRIM's headers (Debian: librocprim-dev; scripts/install_hip.sh)")
endif()
find_library(EMBSCALE_AMDHIP64 amdhip64 PATHS /opt/rocm/lib)
if(NOT EMBSCALE_AMDHIP64)
  message(FATAL_ERROR "EMBSCALE_HIP=ON needs the HIP runtime library amdhip64 (Debian: libamdhip64-dev)")
endif()

set(embscale_hip_lanes "")
set(embscale_offload "")
foreach(arch ${EMBSCALE_HIP_ARCHITECTURES})
  if(arch MATCHES "^gfx9")
    set(lanes 64)   # GCN and CDNA (MI100, MI200, MI300, MI350): 64-lane wavefronts
  elseif(arch MATCHES "^gfx1[0-2]")
    set(lanes 32)   # RDNA: 32-lane wavefronts (the compiler's default there)
  else()
    message(FATAL_ERROR "EMBSCALE_HIP_ARCHITECTURES: unknown AMD target '${arch}' (expected gfx9*, gfx10*, gfx11* or gfx12*)")
  endif()
  if(embscale_hip_lanes AND NOT embscale_hip_lanes EQUAL lanes)
    message(FATAL_ERROR "EMBSCALE_HIP_ARCHITECTURES '${EMBSCALE_HIP_ARCHITECTURES}' mixes 32- and 64-lane targets; "
                        "the lane count is a compile-time constant of a build: build each width separately")
  endif()
  set(embscale_hip_lanes ${lanes})
  list(APPEND embscale_offload --offload-arch=${arch})
endforeach()
if(NOT embscale_hip_lanes)
  message(FATAL_ERROR "EMBSCALE_HIP_ARCHITECTURES is empty")
endif()
message(STATUS "embscale: HIP backend ON (architectures: ${EMBSCALE_HIP_ARCHITECTURES}, ${embscale_hip_lanes} lanes)")

file(GLOB_RECURSE embscale_hip_sources CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/src/core/*.cu ${PROJECT_SOURCE_DIR}/src/fp8/*.cu ${PROJECT_SOURCE_DIR}/src/tbe/*.cu)
# rocPRIM's folder goes on the include path unless it is the system's own (an -isystem /usr/include
# would break the C++ headers' #include_next).
set(embscale_rocprim_flag "")
if(NOT EMBSCALE_ROCPRIM_INCLUDE STREQUAL "/usr/include")
  set(embscale_rocprim_flag -isystem ${EMBSCALE_ROCPRIM_INCLUDE})
endif()
set(embscale_hip_launcher "")
if(EMBSCALE_CCACHE)
  set(embscale_hip_launcher ${EMBSCALE_CCACHE})
endif()
set(embscale_hip_objects "")
foreach(src ${embscale_hip_sources})
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
  set(obj ${PROJECT_BINARY_DIR}/hip/${rel}.o)
  get_filename_component(obj_dir ${obj} DIRECTORY)
  file(MAKE_DIRECTORY ${obj_dir})
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${embscale_hip_launcher} ${EMBSCALE_HIPCC} -x hip -std=c++17 -O3 -fPIC -Wno-unused-result ${embscale_offload}
            -DEMBSCALE_WITH_CUDA=1 -DEMBSCALE_HIP_LANES=${embscale_hip_lanes}
            -I${PROJECT_SOURCE_DIR}/src/core/hip/include -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src
            ${embscale_rocprim_flag} -MD -MF ${obj}.d -c ${src} -o ${obj}
    DEPENDS ${src}
    DEPFILE ${obj}.d
    COMMENT "Building HIP object ${rel}"
    VERBATIM)
  list(APPEND embscale_hip_objects ${obj})
endforeach()
add_custom_target(embscale_hip_objects DEPENDS ${embscale_hip_objects})
set_source_files_properties(${embscale_hip_objects} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
target_sources(embscale PRIVATE ${embscale_hip_objects})
target_compile_definitions(embscale PUBLIC EMBSCALE_WITH_CUDA=1)
target_link_libraries(embscale PUBLIC ${EMBSCALE_AMDHIP64})
