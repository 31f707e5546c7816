# Install layout and the Debian package (included by the top-level CMakeLists.txt).
#   cmake --install BUILD --prefix /opt/ddptrain      bin/ddptrain, bin/ddprun, share/ddptrain/...
#   (cd BUILD && cpack -G DEB)                        BUILD/ddptrain_<version>_<arch>.deb, installing to /usr
# The installed files need nothing from the source tree: the Slurm scripts installed under
# share/ddptrain/slurm default to the installed ddptrain, configs and common.sh (install_slurm_scripts.cmake).
include(GNUInstallDirs)
set(DDPTRAIN_SHARE_DIR ${CMAKE_INSTALL_DATADIR}/ddptrain)

install(TARGETS ddptrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS launch/ddprun DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES launch/configs/imdb.ini launch/configs/quickstart.ini DESTINATION ${DDPTRAIN_SHARE_DIR}/configs)
# The documents, where the README's links expect them: share/ddptrain/README.md, .../launch/CONFIG.md, ...
set(DDPTRAIN_DOCUMENTS README.md ARCHITECTURE.md launch/README.md launch/CONFIG.md io/README.md comm/README.md
    models/GPU.md tests/README.md benchmarks/README.md benchmarks/RESULTS.md)
foreach(document ${DDPTRAIN_DOCUMENTS})
  get_filename_component(folder ${document} DIRECTORY)
  install(FILES ${document} DESTINATION ${DDPTRAIN_SHARE_DIR}/${folder})
endforeach()
install(PROGRAMS launch/torch_checkpoint.py DESTINATION ${DDPTRAIN_SHARE_DIR})
install(FILES launch/slurm/common.sh DESTINATION ${DDPTRAIN_SHARE_DIR}/slurm)
# The sbatch scripts are rewritten at install time, when the prefix is known (cpack installs to its own).
install(CODE "set(DDPTRAIN_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\")
set(DDPTRAIN_SHARE_DIR \"${DDPTRAIN_SHARE_DIR}\")
set(DDPTRAIN_BIN_DIR \"${CMAKE_INSTALL_BINDIR}\")")
install(SCRIPT launch/install/install_slurm_scripts.cmake)

# --- Debian package ----------------------------------------------------------
# Its library dependencies are read off the binary by dpkg-shlibdeps (dpkg-dev), so the package names follow
# the distribution it is built on (libopenmpi3 on Debian 12, libopenmpi3t64 on Ubuntu 24.04). Open MPI's
# launcher is a dependency too: ddprun, the Slurm scripts and the quickstart start ranks with mpirun.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddptrain)
set(CPACK_PACKAGE_VENDOR ddptrain)
set(CPACK_PACKAGE_CONTACT "ddptrain maintainers <ddptrain@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "data-parallel trainer of recurrent text classifiers (MPI, NCCL, cuDNN)")
set(CPACK_PACKAGE_DESCRIPTION
    "ddptrain trains LSTM and GRU text classifiers data-parallel: one MPI rank per GPU with NCCL all-reduce, or CPU ranks with a parameter server, reading HDF5 datasets.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "openmpi-bin")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-h5py, python3-numpy")
if(DDPTRAIN_HAVE_CUDA)
  # CUDA, cuDNN and NCCL unpacked from NVIDIA's tarballs belong to no package; dpkg-shlibdeps looks for them
  # here and leaves them out of the dependencies (the site's toolkit provides them, as check-env reports).
  get_filename_component(cudnn_dir "${CUDNN_LIBRARY}" DIRECTORY)
  get_filename_component(nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CUDAToolkit_LIBRARY_DIR} ${cudnn_dir} ${nccl_dir})
endif()
include(CPack)
