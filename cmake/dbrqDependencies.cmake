# dbrq's system dependencies, found offline through the Debian packages' CMake configs. Included by
# CMakeLists.txt (DBRQ_DEPENDENCY_MODE unset: find_package ... REQUIRED) and by the installed
# dbrqConfig.cmake (DBRQ_DEPENDENCY_MODE=find_dependency: a missing dependency makes
# find_package(dbrq) fail with that dependency's name instead of an error inside dbrq's targets).
#
# Defines what the Bazel labels @system_libs//:x stand for (third_party/system/BUILD.system), as
# the variables DBRQ_SYSTEM_<x>.
include(CMakeFindDependencyMacro)

macro(_dbrq_find)
  if(DBRQ_DEPENDENCY_MODE STREQUAL "find_dependency")
    find_dependency(${ARGN})
  else()
    find_package(${ARGN} REQUIRED)
  endif()
endmacro()

_dbrq_find(Threads)
# The oneDNN build is OpenMP-threaded and dbrq's thread setting calls OpenMP (Bazel: -fopenmp).
_dbrq_find(OpenMP COMPONENTS CXX)
_dbrq_find(absl CONFIG)
_dbrq_find(spdlog CONFIG)
_dbrq_find(nlohmann_json CONFIG)

# oneDNN 2.6. Debian builds it with the OpenCL GPU runtime, so its dnnl-config.cmake calls
# find_package(OpenCL REQUIRED), which needs ocl-icd-opencl-dev and opencl-c-headers; libdnnl-dev
# does not depend on them. Use the config when OpenCL is there, else import libdnnl.so directly
# (dbrq only uses the CPU engine; libdnnl.so.2 itself links libOpenCL.so.1 from ocl-icd-libopencl1).
if(NOT TARGET DNNL::dnnl)
  find_package(OpenCL QUIET)
  if(OpenCL_FOUND)
    _dbrq_find(dnnl CONFIG)
  else()
    find_path(DBRQ_DNNL_INCLUDE_DIR dnnl.hpp)
    find_library(DBRQ_DNNL_LIBRARY NAMES dnnl)
    if(NOT DBRQ_DNNL_INCLUDE_DIR OR NOT DBRQ_DNNL_LIBRARY)
      set(_dbrq_msg "oneDNN not found (dnnl.hpp: ${DBRQ_DNNL_INCLUDE_DIR}, libdnnl: ${DBRQ_DNNL_LIBRARY}); install libdnnl-dev")
      if(DBRQ_DEPENDENCY_MODE STREQUAL "find_dependency")
        set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE "${_dbrq_msg}")
        set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
        return()
      endif()
      message(FATAL_ERROR "${_dbrq_msg}")
    endif()
    add_library(DNNL::dnnl SHARED IMPORTED)
    set_target_properties(DNNL::dnnl PROPERTIES
      IMPORTED_LOCATION "${DBRQ_DNNL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${DBRQ_DNNL_INCLUDE_DIR}")
  endif()
endif()

set(DBRQ_SYSTEM_dnnl DNNL::dnnl)
set(DBRQ_SYSTEM_absl
  absl::flat_hash_map absl::inlined_vector absl::hash absl::span absl::strings absl::str_format
  absl::flags absl::flags_parse absl::flags_reflection)
set(DBRQ_SYSTEM_spdlog spdlog::spdlog)
set(DBRQ_SYSTEM_json nlohmann_json::nlohmann_json)
