# Fails when any C++ source of the project is not formatted as .clang-format says.
file(GLOB_RECURSE files ${SOURCE}/include/*.h ${SOURCE}/src/*.h ${SOURCE}/src/*.cc
  ${SOURCE}/tools/*.h ${SOURCE}/tools/*.cc ${SOURCE}/tests/*.h ${SOURCE}/tests/*.cc
  ${SOURCE}/bench/*.cc ${SOURCE}/bench/*.h ${SOURCE}/examples/*.cc ${SOURCE}/python/*.cc
  ${SOURCE}/fuzz/*.cc)
execute_process(COMMAND ${CLANG_FORMAT} --dry-run -Werror ${files} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "clang-format: files above need formatting (clang-format -i FILE)")
endif()
list(LENGTH files n)
message(STATUS "clang-format: ${n} files formatted")
