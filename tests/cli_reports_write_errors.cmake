# ctest: every embscale command that prints results exits non-zero when standard output cannot take
# them, with one line "error: <command>: error writing standard output: <reason>" on stderr, instead of
# exiting 0 with the results lost. Each command runs three times: with standard output on /dev/null
# (it must succeed: the command line itself is fine), on /dev/full (every write fails with ENOSPC) and
# closed (EBADF). The runs are tiny (one table of one row, 1 Ki elements), so the test takes seconds.
# Run as: cmake -DCLI=<path to embscale> -P cli_reports_write_errors.cmake
# Every case runs; each failure is reported and the script fails at the end.
if(NOT CLI)
  message(FATAL_ERROR "CLI is not set")
endif()
find_program(SH sh)
if(NOT SH)
  message(FATAL_ERROR "sh is needed to run embscale with its standard output redirected or closed")
endif()

set(timeout 120)

# run_redirected(<redirection> <rc var> <stderr var> arg...): `embscale arg... <redirection>` through sh.
function(run_redirected redirection rc_var err_var)
  execute_process(COMMAND ${SH} -c "exec \"$0\" \"$@\" ${redirection}" ${CLI} ${ARGN}
                  RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT ${timeout})
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

# expect_write_error(arg...)
function(expect_write_error)
  string(REPLACE ";" " " args "${ARGN}")
  run_redirected(">/dev/null" rc err ${ARGN})
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "embscale ${args} >/dev/null: exit status ${rc}, expected 0\n${err}")
    return()
  endif()
  foreach(case "/dev/full|>/dev/full|No space left on device" "closed|>&-|Bad file descriptor")
    string(REPLACE "|" ";" case "${case}")
    list(GET case 0 what)
    list(GET case 1 redirection)
    list(GET case 2 reason)
    run_redirected("${redirection}" rc err ${ARGN})
    string(REGEX MATCHALL "[^\n]*standard output[^\n]*" lines "${err}")
    list(LENGTH lines count)
    if(rc EQUAL 0 OR NOT rc MATCHES "^[0-9]+$")
      message(SEND_ERROR "embscale ${args} (stdout ${what}): exit status ${rc}, expected a failure\n${err}")
    elseif(NOT count EQUAL 1 OR NOT lines MATCHES "^error: embscale[^:]*: error writing standard output: ${reason}$")
      message(SEND_ERROR "embscale ${args} (stdout ${what}): expected one line \"error: embscale...: error writing "
                         "standard output: ${reason}\" on stderr, got:\n${err}")
    else()
      message(STATUS "reported as expected (stdout ${what}, exit ${rc}): embscale ${args}")
    endif()
  endforeach()
endfunction()

set(tiny_tbe --backend cpu --num-tables 1 --batch-size 1 --bag-size 1 --num-embeddings 1 --embedding-dim 1
             --iters 1 --warmup 0)
set(tiny_fp8 --backend cpu --ops amax --dtypes fp32 --sizes 1K --shape 8x8 --iters 1 --warmup 0)

expect_write_error(info)
expect_write_error(--help)
expect_write_error(bench --help)
expect_write_error(check --list)
expect_write_error(check --backend cpu amax)
expect_write_error(bench fp8 ${tiny_fp8})
expect_write_error(bench fp8 ${tiny_fp8} --json)
expect_write_error(bench fp8 ${tiny_fp8} --dry-run)
expect_write_error(bench tbe-forward ${tiny_tbe})
expect_write_error(bench tbe-forward ${tiny_tbe} --json)
expect_write_error(bench tbe-backward ${tiny_tbe} --json)
expect_write_error(bench tbe-train ${tiny_tbe})

# A refusal prints nothing to standard output: closed, it is not an error of its own (status 2, one line).
run_redirected(">&-" rc err check --backend nope)
if(NOT rc EQUAL 2 OR err MATCHES "standard output")
  message(SEND_ERROR "embscale check --backend nope (stdout closed): exit status ${rc}, expected 2 and no "
                     "write error\n${err}")
endif()
