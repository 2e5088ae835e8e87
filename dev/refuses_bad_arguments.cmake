# ctest (dev.refuses_bad_arguments): embscale-dev refuses nonsense arguments as the embscale CLI does,
# with exit status 2 and "error: <flag>: <reason>" on stderr, before it allocates or runs anything.
# Run as: cmake -DDEV=<path to embscale-dev> -P refuses_bad_arguments.cmake
if(NOT DEV)
  message(FATAL_ERROR "DEV is not set")
endif()

set(failures 0)
# expect_refused("<flag named in the message>" arg...)
function(expect_refused flag)
  execute_process(COMMAND ${DEV} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  string(REPLACE ";" " " args "${ARGN}")
  string(FIND "${err}" "error: ${flag}:" at)
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(SEND_ERROR "embscale-dev ${args}: exit status ${rc}, expected 2 and a message naming ${flag}\n${out}${err}")
  else()
    message(STATUS "refused as expected: embscale-dev ${args}")
  endif()
endfunction()

expect_refused("--variants" tbe-forward --variants default,nope)
expect_refused("--variants" tbe-forward --variants "")
expect_refused("--order" tbe-forward --order diagonal)
expect_refused("--bags" tbe-forward --bags 65)
expect_refused("--bags" tbe-forward --bags -1)
expect_refused("--l2-fetch-bytes" tbe-forward --l2-fetch-bytes 129)
expect_refused("--backend" tbe-forward --backend cpu)
expect_refused("--sweep" tbe-forward --sweep all)
