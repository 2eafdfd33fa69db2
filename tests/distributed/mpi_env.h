// The environment of the MPI processes the distributed tests start.
//
// OpenMPI names its session directory (default /tmp/ompi.<host>.<uid>/pid.<pid>) and its
// shared-memory segments (vader's backing files, default /dev/shm) after the launcher's pid. Bazel
// runs each test in a PID namespace of its own, so MPI tests running at the same time all see
// pid ~19, share those names, and one test's clean-up deletes the other's files: "A system call
// failed during shared memory initialization ... open(2) No such file or directory", then
// MPI_Init fails. Every MPI process a test starts therefore keeps its files in the test's private
// TEST_TMPDIR.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace dbrq::testing {

// OpenMPI's directories, all in TEST_TMPDIR (empty outside a Bazel test).
inline std::vector<std::pair<std::string, std::string>> mpi_private_dirs() {
  const char* dir = std::getenv("TEST_TMPDIR");
  if (dir == nullptr || *dir == '\0') return {};
  return {{"OMPI_MCA_orte_tmpdir_base", dir},
          {"OMPI_MCA_btl_vader_backing_directory", dir},
          {"OMPI_MCA_shmem_mmap_backing_file_base_dir", dir},
          {"OMPI_MCA_osc_sm_backing_directory", dir}};
}

// For mpirun: root in a container, shared memory between local ranks (no network probing), one
// kernel thread per rank (4 ranks on 2 cores), and the private directories above.
inline std::vector<std::pair<std::string, std::string>> mpi_env() {
  std::vector<std::pair<std::string, std::string>> env = {
      {"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
      {"OMPI_MCA_btl", "self,vader"}, {"OMP_NUM_THREADS", "1"}};
#if defined(__SANITIZE_ADDRESS__)
  // OpenMPI's own allocations are never freed before exit; LeakSanitizer would fail every rank.
  env.push_back({"ASAN_OPTIONS", "detect_leaks=0"});
#endif
  for (auto& kv : mpi_private_dirs()) env.push_back(std::move(kv));
  return env;
}

}  // namespace dbrq::testing
