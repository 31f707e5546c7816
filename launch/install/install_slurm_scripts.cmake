# Installs launch/slurm/*.sbatch with defaults that point at the installed files instead of the source tree
# they are submitted from: the installed ddptrain, configs and common.sh. Each rewritten line must be found,
# so a change to the scripts that breaks this fails the install instead of shipping a script that cannot run.
set(prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
set(slurm_dir "${prefix}/${DDPTRAIN_SHARE_DIR}/slurm")
file(GLOB scripts "${DDPTRAIN_SOURCE_DIR}/launch/slurm/*.sbatch")
foreach(script IN LISTS scripts)
  file(READ "${script}" text)
  get_filename_component(name "${script}" NAME)
  # old line -> new line, by the installed paths (without DESTDIR: where the package puts them).
  set(share "${CMAKE_INSTALL_PREFIX}/${DDPTRAIN_SHARE_DIR}")
  set(replacements
      "CONFIG=\${CONFIG:-launch/configs/" "CONFIG=\${CONFIG:-${share}/configs/"
      "DDPTRAIN=\${DDPTRAIN:-build/ddptrain}" "DDPTRAIN=\${DDPTRAIN:-${CMAKE_INSTALL_PREFIX}/${DDPTRAIN_BIN_DIR}/ddptrain}"
      "source \"\${DDPTRAIN_ROOT:-\${SLURM_SUBMIT_DIR:-.}}/launch/slurm/common.sh\"" "source \"${share}/slurm/common.sh\""
      "sbatch launch/slurm/" "sbatch ${share}/slurm/"
      "# shellcheck source=launch/slurm/common.sh" "# shellcheck source=common.sh")
  list(LENGTH replacements count)
  math(EXPR last "${count} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET replacements ${i} old)
    list(GET replacements ${j} new)
    string(FIND "${text}" "${old}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "install: launch/slurm/${name} has no line with '${old}' to point at the installed files")
    endif()
    string(REPLACE "${old}" "${new}" text "${text}")
  endforeach()
  message(STATUS "Installing: ${slurm_dir}/${name}")
  file(WRITE "${slurm_dir}/${name}" "${text}")
  file(CHMOD "${slurm_dir}/${name}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                                                  WORLD_READ WORLD_EXECUTE)
endforeach()
