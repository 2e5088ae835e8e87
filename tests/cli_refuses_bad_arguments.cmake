# ctest: the embscale CLI refuses nonsense arguments with exit status 2 and a message naming the flag
# ("error: <flag>: <reason>" on stderr), before it allocates or runs anything, so every case is fast.
# Run as: cmake -DCLI=<path to embscale> -P cli_refuses_bad_arguments.cmake
# Every case runs; each failure is reported and the script fails at the end.
if(NOT CLI)
  message(FATAL_ERROR "CLI is not set")
endif()

# A refusal is immediate; a case that instead starts a run is cut off (and fails) after this long.
set(timeout 60)

# expect_refused("<flag named in the message>" arg...)
function(expect_refused flag)
  execute_process(COMMAND ${CLI} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT ${timeout})
  string(REPLACE ";" " " args "${ARGN}")
  check_refusal("${flag}" "${args}" "${rc}" "${out}" "${err}")
endfunction()

# expect_refused_saying(<flag> <text> arg...): refused as expect_refused, with <text> in the message.
function(expect_refused_saying flag text)
  execute_process(COMMAND ${CLI} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT ${timeout})
  string(REPLACE ";" " " args "${ARGN}")
  string(FIND "${err}" "${text}" at)
  if(rc EQUAL 2 AND at EQUAL -1)
    message(SEND_ERROR "embscale ${args}: the message does not say \"${text}\":\n${err}")
    return()
  endif()
  check_refusal("${flag}" "${args}" "${rc}" "${out}" "${err}")
endfunction()

# expect_refused_empty(<flag> arg...): `embscale arg... <flag> ""` (an empty value must not read as
# "not given"; a list expansion would drop it, so it is spelt out here).
function(expect_refused_empty flag)
  execute_process(COMMAND ${CLI} ${ARGN} ${flag} "" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT ${timeout})
  string(REPLACE ";" " " args "${ARGN} ${flag} ''")
  check_refusal("${flag}" "${args}" "${rc}" "${out}" "${err}")
endfunction()

function(check_refusal flag args rc out err)
  if(NOT rc EQUAL 2)
    message(SEND_ERROR "embscale ${args}: exit status ${rc}, expected 2\n${out}${err}")
    return()
  endif()
  string(FIND "${err}" "error: ${flag}:" at)
  if(at EQUAL -1)
    message(SEND_ERROR "embscale ${args}: the message does not name ${flag}:\n${err}")
    return()
  endif()
  message(STATUS "refused as expected: embscale ${args}")
endfunction()

# expect_ok(arg...): exit status 0 (and the output in `ok_output` of the caller's scope).
function(expect_ok)
  execute_process(COMMAND ${CLI} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT ${timeout})
  string(REPLACE ";" " " args "${ARGN}")
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "embscale ${args}: exit status ${rc}, expected 0\n${out}${err}")
  else()
    message(STATUS "accepted as expected: embscale ${args}")
  endif()
  set(ok_output "${out}" PARENT_SCOPE)
endfunction()

# ---- the kernel laboratory's flags are embscale-dev's (dev/README.md), not options of the CLI ----
expect_refused("--sweep" bench tbe-forward --backend cpu --sweep all)
expect_refused("--gather-ceiling" bench tbe-forward --backend cpu --gather-ceiling)
expect_refused("--l2-fetch-bytes" bench tbe-forward --backend cpu --l2-fetch-bytes 32)

# ---- values the subcommands refuse ----
expect_refused("--batch-size" bench tbe-forward --backend cpu --batch-size -1)
expect_refused("--num-tables" bench tbe-forward --backend cpu --num-tables 0)
expect_refused("--embedding-dim" bench tbe-train --backend cpu --embedding-dim 0)
expect_refused("--alpha" bench tbe-forward --backend cpu --alpha -1)
expect_refused("--bag-size" bench tbe-backward --backend cpu --bag-size -3)
expect_refused("--optimizer" bench tbe-backward --backend cpu --optimizer nope)
expect_refused("--sizes" bench fp8 --backend cpu --sizes abc)
expect_refused("--backend" check --backend nope)
expect_refused("ops" check --backend cpu no_such_op)

# Sizes whose byte counts overflow 64 bits (was SIGFPE: the bytes wrapped to 0, then divided).
expect_refused("--sizes" bench fp8 --backend cpu --dtypes fp32 --sizes 2^62)
expect_refused("--sizes" bench fp8 --backend cpu --dtypes fp16 --sizes 1<<62)
# Sizes no machine holds (was SIGABRT on an uncaught std::bad_alloc): 4 TiB of fp32 and more.
expect_refused("--sizes" bench fp8 --backend cpu --sizes 2^40)
expect_refused("--sizes" bench fp8 --backend cpu --ops amax --dtypes bf16 --sizes 64K,2^42)
expect_refused("--shape" bench fp8 --backend cpu --shape 2^20x2^20)
expect_refused("--shape" bench fp8 --backend cpu --shape 2^21x2^20)
expect_refused("--shape" bench fp8 --backend cpu --shape 0x16)
# --sizes 8G (32 GiB of fp32; 72 GiB at the run's peak) is refused where the machine has less.
cmake_host_system_information(RESULT physical_mib QUERY TOTAL_PHYSICAL_MEMORY)
if(physical_mib LESS 65536)
  expect_refused("--sizes" bench fp8 --backend cpu --sizes 8G)
else()
  message(STATUS "skipped: bench fp8 --sizes 8G (this machine has ${physical_mib} MiB, enough to run it)")
endif()
# Lists: an empty element is refused with its position (CLI11's splitting dropped it: "1000,,2000" ran
# two sizes), whichever list option and wherever the element is.
expect_refused_saying("--sizes" "element 2 of '1000,,2000' is empty" bench fp8 --backend cpu --sizes 1000,,2000 --dry-run)
expect_refused_saying("--sizes" "element 1 of ',1000' is empty" bench fp8 --backend cpu --sizes ,1000 --dry-run)
expect_refused_saying("--sizes" "element 2 of '1000,' is empty" bench fp8 --backend cpu --sizes 1000, --dry-run)
expect_refused_saying("--sizes" "element 3 of '1K,2K,,' is empty" bench fp8 --backend cpu --sizes 1K --sizes 1K,2K,, --dry-run)
expect_refused_saying("--ops" "element 2 of 'amax,,quantize' is empty" bench fp8 --backend cpu --ops amax,,quantize --dry-run)
expect_refused_saying("--ops" "element 1 of ',' is empty" bench fp8 --backend cpu --ops , --dry-run)
expect_refused_saying("--dtypes" "element 2 of 'fp32,' is empty" bench fp8 --backend cpu --dtypes fp32, --dry-run)
expect_refused_empty("--sizes" bench fp8 --backend cpu --dry-run)
expect_refused_empty("--ops" bench fp8 --backend cpu --dry-run)
expect_refused_empty("--dtypes" bench fp8 --backend cpu --dry-run)
# ... while a list given as several values, or more than once, is one list.
expect_ok(bench fp8 --backend cpu --ops amax --dtypes fp32 --sizes 1K 2K --sizes 4K,8K --dry-run --json)
string(REGEX MATCHALL "\"n\":[0-9]+" sizes "${ok_output}")
if(NOT sizes STREQUAL "\"n\":1024;\"n\":2048;\"n\":4096;\"n\":8192")
  message(SEND_ERROR "bench fp8 --sizes 1K 2K --sizes 4K,8K: planned ${sizes}, expected n = 1024, 2048, 4096, 8192")
endif()
expect_refused_empty("--shape" bench fp8 --backend cpu)
expect_refused_empty("--backend" bench fp8)
expect_refused("--warmup" bench fp8 --backend cpu --warmup -1)
expect_refused("--iters" bench fp8 --backend cpu --iters 0)
expect_refused("--iters" bench fp8 --backend cpu --iters 2147483648)

# Rotating copies stay near three times the cache whatever the size, so a run's peak (the input copies
# plus an op's own copies) stays within a few times the cache (the copies were counted from the
# unpadded bytes: one fp32 element took 3 * cache / 4 copies of 256 bytes, 192 times the cache).
expect_ok(bench fp8 --backend cpu --ops amax,quantize,dequantize --dtypes fp32,bf16 --sizes 1,16,1000 --dry-run --json)
string(REGEX MATCHALL "{[^\n]*}" plans "${ok_output}")
list(LENGTH plans plan_count)
if(NOT plan_count EQUAL 6)
  message(SEND_ERROR "bench fp8 --dry-run: ${plan_count} plans, expected 6:\n${ok_output}")
endif()
foreach(plan IN LISTS plans)
  string(JSON peak GET "${plan}" peak_bytes)
  string(JSON cache GET "${plan}" cache_bytes)
  string(JSON n GET "${plan}" n)
  math(EXPR bound "8 * ${cache} + (1 << 20)")
  if(peak GREATER bound)
    message(SEND_ERROR "bench fp8 n=${n}: peak ${peak} bytes, more than 8 x the cache (${cache} bytes) + 1 MiB")
  endif()
endforeach()

# Seeds: negative or beyond 2^64 - 1 (they wrapped silently), or not decimal.
expect_refused("--seed" check --seed -1 amax)
expect_refused("--seed" check --seed 18446744073709551616 amax)
expect_refused("--seed" check --seed 0x10 amax)
expect_refused("--seed" bench fp8 --backend cpu --seed -1)
expect_refused("--seed" bench tbe-forward --backend cpu --seed 99999999999999999999)
expect_refused("--threads" bench tbe-forward --backend cpu --threads 0)
expect_refused("--threads" bench tbe-backward --backend cpu --threads 1025)
expect_refused("--threads" bench tbe-train --backend cpu --threads -3)
expect_refused("--threads" bench fp8 --backend cpu --threads two)

# The other numeric flags: negative, zero, out of range, sentinel, overflow, absurd sizes.
expect_refused("--batch-size" bench tbe-forward --backend cpu --batch-size -9223372036854775808)
expect_refused("--batch-size" bench tbe-forward --backend cpu --batch-size 4611686018427387904 --num-tables 4)
expect_refused("--batch-size" bench tbe-forward --backend cpu --batch-size 1099511627776 --bag-size 0 --num-tables 1)
expect_refused("--num-embeddings" bench tbe-forward --backend cpu --num-embeddings 1152921504606846976 --num-tables 1)
expect_refused("--num-embeddings" bench tbe-train --backend cpu --optimizer adam --num-embeddings 1000000000000)
expect_refused("--num-embeddings" bench tbe-forward --backend cpu --num-embeddings 0)
expect_refused("--embedding-dim" bench tbe-forward --backend cpu --embedding-dim 65537)
expect_refused("--bag-size" bench tbe-forward --backend cpu --bag-size 2000000)
expect_refused("--num-tables" bench tbe-forward --backend cpu --num-tables 100001)
expect_refused("--iters" bench tbe-forward --backend cpu --iters 2000000)
expect_refused("--warmup" bench tbe-train --backend cpu --warmup -1)
expect_refused("--alpha" bench tbe-forward --backend cpu --alpha 1e400)
expect_refused("--alpha" bench tbe-forward --backend cpu --alpha nan)
expect_refused("--learning-rate" bench tbe-backward --backend cpu --learning-rate 1e39)
expect_refused("--learning-rate" bench tbe-backward --backend cpu --learning-rate -0.5)
expect_refused("--rounding" bench tbe-train --backend cpu --rounding near)
expect_refused("--block-threads" bench tbe-backward --backend cpu --block-threads -5)
expect_refused("--max-warp-segment" bench tbe-backward --backend cpu --max-warp-segment -1)
expect_refused("--max-block-segment" bench tbe-backward --backend cpu --max-block-segment 4294967296)
expect_refused_empty("--backend" bench tbe-forward)
expect_refused_empty("--output-dtype" bench tbe-forward --backend cpu)
expect_refused_empty("--backend" check)
expect_refused("ops" check --list no_such_op)
expect_refused("--indices-dtype" bench tbe-forward --backend cpu --indices-dtype 32 --num-tables 1
               --embedding-dim 1 --num-embeddings 3000000000)

# ---- named values: the help lists exactly what is accepted, and a refusal lists the same ----
# (FBGEMM's upper-case BoundsCheckMode and PoolingMode names were accepted but not listed.) Every name the
# help of --bounds-check and --pooling lists runs, with the mode it stands for in its record; the
# refusal of a name it does not list lists the same names.
set(tiny_tbe bench tbe-forward --backend cpu --num-tables 1 --batch-size 1 --bag-size 1 --num-embeddings 1
             --embedding-dim 1 --iters 1 --warmup 0 --json)
expect_ok(bench tbe-forward --help)
set(help "${ok_output}")
# check_named_values(<flag> <record field> <name=mode;...> <names the help must not list>...)
function(check_named_values flag field meanings)
  string(REGEX MATCH "${flag} TEXT=[a-z]+ +([^\n(]*[^\n( ])" line "${help}")
  set(listed "${CMAKE_MATCH_1}")
  if(listed STREQUAL "")
    message(SEND_ERROR "${flag}: its line of `bench tbe-forward --help` lists no values:\n${help}")
    return()
  endif()
  string(REPLACE " or " ", " names "${listed}")
  string(REPLACE ", " ";" names "${names}")
  set(want "")
  foreach(meaning IN LISTS meanings)
    string(REPLACE "=" ";" meaning "${meaning}")
    list(GET meaning 0 name)
    list(APPEND want "${name}")
  endforeach()
  if(NOT names STREQUAL want)
    message(SEND_ERROR "${flag}: the help lists '${names}', expected '${want}'")
  endif()
  foreach(meaning IN LISTS meanings)
    string(REPLACE "=" ";" meaning "${meaning}")
    list(GET meaning 0 name)
    list(GET meaning 1 mode)
    expect_ok(${tiny_tbe} ${flag} ${name})
    string(REGEX MATCH "{[^\n]*}" record "${ok_output}")
    if(record STREQUAL "")
      message(SEND_ERROR "${flag} ${name}: no record")
    else()
      string(JSON got GET "${record}" ${field})
      if(NOT got STREQUAL mode)
        message(SEND_ERROR "${flag} ${name}: the record says ${field} ${got}, expected ${mode}")
      endif()
    endif()
  endforeach()
  foreach(unlisted IN LISTS ARGN)
    expect_refused_saying("${flag}" "'${unlisted}'; expected ${listed}" ${tiny_tbe} ${flag} ${unlisted})
  endforeach()
endfunction()
check_named_values(--bounds-check bounds_check
                   "error=error;skip=skip;off=off;warn=warn;FATAL=error;IGNORE=skip;NONE=off;WARNING=warn"
                   Fatal fatal ERROR none warning WARN)
check_named_values(--pooling pooling "sum=sum;mean=mean;none=none;SUM=sum;MEAN=mean;NONE=none;sequence=none"
                   Sum avg)

# ---- what the parser itself refuses: the same message format and status ----
expect_refused("--nope" bench fp8 --backend cpu --nope)
expect_refused("--nope" check --nope)
expect_refused("--iters" bench fp8 --backend cpu --iters abc)
expect_refused("--batch-size" bench tbe-forward --backend cpu --batch-size 1.5)
expect_refused("--iters" bench fp8 --backend cpu --iters)
expect_refused("--iters" bench tbe-forward --backend cpu --iters 1 --iters 2)
expect_refused("extra" info extra)
expect_refused("bnch" bnch)
expect_refused("embscale")

# --help is not a refusal.
expect_ok(--help)
expect_ok(bench fp8 --help)
expect_ok(check --help)
