// MPI plumbing for distributed calibration (and, later, distributed tuning): a communicator whose
// every collective has a deadline, a vote on success that names each failed rank and its cause,
// and an early-stop notice a failing rank sends so the others stop working on their shards.
//
//   dbrq::distributed::MpiSession mpi(&argc, &argv);          // MPI_Init_thread / MPI_Finalize
//   dbrq::distributed::Comm comm(/*timeout_seconds=*/600);
//   dbrq::distributed::RankStatus mine = ...;                 // ok, or the message of what failed
//   std::vector<RankStatus> all = comm.agree(mine, "calibrating");   // every rank gets every status
//   std::vector<std::string> parts = comm.gather(blob, 0);          // rank 0 gets every rank's bytes
//   std::string s = comm.broadcast(blob_on_rank_0, 0);               // every rank gets rank 0's
//
// Only this folder includes <mpi.h> (tools/check_layers.sh); the core library never links MPI.
// A collective that does not complete within the timeout (a rank hung, or died without MPI
// noticing) prints which rank waited at which stage and ends the job with MPI_Abort: no hang.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace dbrq::distributed {

// A distributed run failed on some rank; the message names every failed rank and its cause, and
// is the same on every rank.
class DistributedError : public Error {
 public:
  using Error::Error;

 protected:
  [[noreturn]] void rethrow_as(const std::string& prefix, bool located) const override {
    DistributedError e(prefix + what());
    e.has_location_ = located;
    throw e;
  }
};

// MPI_Init_thread (MPI_THREAD_FUNNELED: only the calling thread talks to MPI; oneDNN's OpenMP
// threads never do) and MPI_Finalize. One per process, before any Comm.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  static bool initialized();
};

struct RankStatus {
  bool ok = true;
  std::string message;  // what failed, when !ok
};

class Comm {
 public:
  // MPI_COMM_WORLD. timeout_seconds bounds every wait in a collective (> 0).
  explicit Comm(double timeout_seconds = 600.0);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_seconds() const { return timeout_; }

  // Every rank calls it with its own status; every rank receives all of them, in rank order.
  std::vector<RankStatus> agree(const RankStatus& mine, const std::string& stage);
  // Like agree(), but throws DistributedError (the same message on every rank) when any rank
  // failed: "<stage> failed on rank 2 of 4: <cause>; on rank 3 of 4: <cause>".
  void agree_or_throw(const RankStatus& mine, const std::string& stage);

  // `root` receives every rank's bytes (its own included), in rank order; other ranks get {}.
  std::vector<std::string> gather(const std::string& mine, int root, const std::string& stage);
  // Point to point (the tree reduction): bytes to / from one rank, with the same deadline.
  void send(const std::string& data, int to, const std::string& stage);
  std::string receive(int from, const std::string& stage);
  // Every rank receives root's `data` (ignored elsewhere).
  std::string broadcast(const std::string& data, int root, const std::string& stage);

  // Early stop: a failing rank tells every other rank (non-blocking sends), which see it through
  // stop_requested() between items of work and join the next agree() without finishing their
  // shards. finish_notices() completes the sends and consumes the notices of the ranks that
  // failed (call it after the agree() that follows); a notice is never left unreceived.
  void notify_failure();
  bool stop_requested();
  void finish_notices(const std::vector<RankStatus>& statuses);

  // Bytes this rank sent and received through gather / broadcast / send / receive.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  void wait(void* request, const std::string& stage);  // MPI_Request*, polled until the deadline

  int rank_ = 0;
  int size_ = 1;
  double timeout_ = 600.0;
  struct Notices;                    // the pending MPI requests of notify_failure()
  std::unique_ptr<Notices> notices_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

// "rank 2 of 4: <message>" lines of the failed ranks, joined by "; ".
std::string describe_failures(const std::vector<RankStatus>& statuses);

}  // namespace dbrq::distributed
