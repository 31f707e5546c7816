# CTest's core slots. The suite runs with `ctest -j <slots + 2> --resource-spec-file ctest-cores.json`
# (launch/bootstrap.sh): every test takes one of the machine's core slots (RESOURCE_GROUPS cores:1) but
# those labelled `waits`, whose processes sleep most of their run (Slurm's time limits and requeues, a
# suspended job), which then run beside the others instead of holding a slot idle. Without the file, CTest
# ignores RESOURCE_GROUPS and `-j` alone counts.
set(DDPTRAIN_TEST_CORE_SLOTS 2 CACHE STRING "Core slots of the tests' resource file (ctest-cores.json)")
set(DDPTRAIN_TEST_RESOURCES RESOURCE_GROUPS cores:1)

# Gives every test of the calling directory but the `waits` ones a core slot.
function(ddptrain_tests_take_core_slots)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(test ${tests})
    get_test_property(${test} LABELS labels)
    if(NOT "waits" IN_LIST labels)
      set_tests_properties(${test} PROPERTIES RESOURCE_GROUPS cores:1)
    endif()
  endforeach()
endfunction()

file(WRITE ${CMAKE_BINARY_DIR}/ctest-cores.json
     "{\"version\": {\"major\": 1, \"minor\": 0},\n"
     " \"local\": [{\"cores\": [{\"id\": \"0\", \"slots\": ${DDPTRAIN_TEST_CORE_SLOTS}}]}]}\n")
