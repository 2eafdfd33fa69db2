#include "distributed/comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace dbrq::distributed {
namespace {

constexpr int kNoticeTag = 7315;  // early-stop notices (notify_failure)
constexpr int kDataTag = 7316;    // send / receive

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  DBRQ_THROW(DistributedError, what, " failed: ", std::string(text, static_cast<size_t>(len)));
}

int checked_count(size_t bytes, const std::string& stage) {
  DBRQ_ENSURE(bytes <= static_cast<size_t>(INT_MAX), DistributedError, stage, ": ", bytes,
              " bytes exceed what one MPI message carries (", INT_MAX, ")");
  return static_cast<int>(bytes);
}

}  // namespace

struct Comm::Notices {
  bool sent = false;
  int payload = 1;
  std::vector<MPI_Request> requests;
};

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  // Errors come back as codes (turned into DistributedError), not as MPI's default abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

bool MpiSession::initialized() {
  int init = 0, finalized = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&finalized);
  return init && !finalized;
}

Comm::Comm(double timeout_seconds) : timeout_(timeout_seconds), notices_(std::make_unique<Notices>()) {
  DBRQ_ENSURE(MpiSession::initialized(), UsageError,
              "distributed::Comm: MPI is not initialized; create a distributed::MpiSession first");
  DBRQ_ENSURE(timeout_seconds > 0, ValueError, "distributed::Comm: timeout_seconds must be > 0, got ",
              timeout_seconds);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

Comm::~Comm() {
  // Sends still pending at destruction (an exception skipped finish_notices): cancel them so
  // MPI_Finalize does not wait for a receiver that never comes.
  for (MPI_Request& r : notices_->requests) {
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }
}

void Comm::wait(void* request_ptr, const std::string& stage) {
  MPI_Request* request = static_cast<MPI_Request*>(request_ptr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      // A rank is hung, or gone without MPI noticing: no collective can complete. MPI_Abort ends
      // every rank of the job (mpirun then exits non-zero); nothing has been written.
      std::cerr << "dbrq: rank " << rank_ << " of " << size_ << ": " << stage << ": no answer from every rank within "
                << timeout_ << " s (a rank is hung or died); aborting the job" << std::endl;
      MPI_Abort(MPI_COMM_WORLD, 3);
      std::_Exit(3);  // not reached
    }
    // Polling with back-off: ranks may share cores (mpirun --oversubscribe); a spinning waiter
    // would steal them from the ranks still working.
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(5)) pause *= 2;
  }
}

std::vector<RankStatus> Comm::agree(const RankStatus& mine, const std::string& stage) {
  const int head[2] = {mine.ok ? 1 : 0, checked_count(mine.ok ? 0 : mine.message.size(), stage)};
  std::vector<int> heads(static_cast<size_t>(2 * size_));
  MPI_Request req;
  check_mpi(MPI_Iallgather(head, 2, MPI_INT, heads.data(), 2, MPI_INT, MPI_COMM_WORLD, &req), "MPI_Iallgather");
  wait(&req, stage);
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[static_cast<size_t>(r)] = heads[static_cast<size_t>(2 * r + 1)];
    displs[static_cast<size_t>(r)] = checked_count(static_cast<size_t>(total), stage);
    total += counts[static_cast<size_t>(r)];
  }
  std::vector<RankStatus> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) out[static_cast<size_t>(r)].ok = heads[static_cast<size_t>(2 * r)] != 0;
  if (total > 0) {
    std::string all(static_cast<size_t>(total), '\0');
    const std::string text = mine.ok ? std::string() : mine.message;
    check_mpi(MPI_Iallgatherv(text.data(), static_cast<int>(text.size()), MPI_CHAR, all.data(), counts.data(),
                              displs.data(), MPI_CHAR, MPI_COMM_WORLD, &req),
              "MPI_Iallgatherv");
    wait(&req, stage);
    for (int r = 0; r < size_; ++r) {
      out[static_cast<size_t>(r)].message =
          all.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]), static_cast<size_t>(counts[static_cast<size_t>(r)]));
    }
  }
  return out;
}

std::string describe_failures(const std::vector<RankStatus>& statuses) {
  std::string out;
  const int n = static_cast<int>(statuses.size());
  for (int r = 0; r < n; ++r) {
    if (statuses[static_cast<size_t>(r)].ok) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", "rank ", r, " of ", n, ": ", statuses[static_cast<size_t>(r)].message);
  }
  return out;
}

void Comm::agree_or_throw(const RankStatus& mine, const std::string& stage) {
  const std::vector<RankStatus> all = agree(mine, stage);
  const std::string failures = describe_failures(all);
  DBRQ_ENSURE(failures.empty(), DistributedError, stage, " failed on ", failures);
}

std::vector<std::string> Comm::gather(const std::string& mine, int root, const std::string& stage) {
  const long long len = static_cast<long long>(mine.size());
  std::vector<long long> lens(static_cast<size_t>(size_));
  MPI_Request req;
  check_mpi(MPI_Igather(&len, 1, MPI_LONG_LONG, lens.data(), 1, MPI_LONG_LONG, root, MPI_COMM_WORLD, &req),
            "MPI_Igather");
  wait(&req, stage);
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  size_t total = 0;
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      counts[static_cast<size_t>(r)] = checked_count(static_cast<size_t>(lens[static_cast<size_t>(r)]), stage);
      displs[static_cast<size_t>(r)] = checked_count(total, stage);
      total += static_cast<size_t>(lens[static_cast<size_t>(r)]);
    }
  }
  std::string all(total, '\0');
  check_mpi(MPI_Igatherv(mine.data(), checked_count(mine.size(), stage), MPI_CHAR, all.data(), counts.data(),
                         displs.data(), MPI_CHAR, root, MPI_COMM_WORLD, &req),
            "MPI_Igatherv");
  wait(&req, stage);
  std::vector<std::string> out;
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]),
                               static_cast<size_t>(counts[static_cast<size_t>(r)])));
    }
    bytes_received_ += static_cast<int64_t>(total - mine.size());
  } else {
    bytes_sent_ += static_cast<int64_t>(mine.size());
  }
  return out;
}

void Comm::send(const std::string& data, int to, const std::string& stage) {
  const long long len = static_cast<long long>(data.size());
  MPI_Request req;
  check_mpi(MPI_Isend(&len, 1, MPI_LONG_LONG, to, kDataTag, MPI_COMM_WORLD, &req), "MPI_Isend");
  wait(&req, stage);
  check_mpi(MPI_Isend(data.data(), checked_count(data.size(), stage), MPI_CHAR, to, kDataTag, MPI_COMM_WORLD, &req),
            "MPI_Isend");
  wait(&req, stage);
  bytes_sent_ += static_cast<int64_t>(data.size());
}

std::string Comm::receive(int from, const std::string& stage) {
  long long len = 0;
  MPI_Request req;
  check_mpi(MPI_Irecv(&len, 1, MPI_LONG_LONG, from, kDataTag, MPI_COMM_WORLD, &req), "MPI_Irecv");
  wait(&req, stage);
  std::string out(static_cast<size_t>(len), '\0');
  check_mpi(MPI_Irecv(out.data(), checked_count(out.size(), stage), MPI_CHAR, from, kDataTag, MPI_COMM_WORLD, &req),
            "MPI_Irecv");
  wait(&req, stage);
  bytes_received_ += static_cast<int64_t>(out.size());
  return out;
}

std::string Comm::broadcast(const std::string& data, int root, const std::string& stage) {
  long long len = rank_ == root ? static_cast<long long>(data.size()) : 0;
  MPI_Request req;
  check_mpi(MPI_Ibcast(&len, 1, MPI_LONG_LONG, root, MPI_COMM_WORLD, &req), "MPI_Ibcast");
  wait(&req, stage);
  std::string out = rank_ == root ? data : std::string(static_cast<size_t>(len), '\0');
  check_mpi(MPI_Ibcast(out.data(), checked_count(out.size(), stage), MPI_CHAR, root, MPI_COMM_WORLD, &req),
            "MPI_Ibcast");
  wait(&req, stage);
  if (rank_ == root) {
    bytes_sent_ += static_cast<int64_t>(out.size()) * (size_ - 1);
  } else {
    bytes_received_ += static_cast<int64_t>(out.size());
  }
  return out;
}

void Comm::notify_failure() {
  if (notices_->sent) return;
  notices_->sent = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req;
    if (MPI_Isend(&notices_->payload, 1, MPI_INT, r, kNoticeTag, MPI_COMM_WORLD, &req) == MPI_SUCCESS) {
      notices_->requests.push_back(req);
    }
  }
}

bool Comm::stop_requested() {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

void Comm::finish_notices(const std::vector<RankStatus>& statuses) {
  // Every failed rank notified every other rank once (a rank reports a failure through agree()
  // only after notify_failure(): see calibrate.cc); consume those notices.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || statuses[static_cast<size_t>(r)].ok) continue;
    int payload = 0;
    MPI_Request req;
    check_mpi(MPI_Irecv(&payload, 1, MPI_INT, r, kNoticeTag, MPI_COMM_WORLD, &req), "MPI_Irecv");
    wait(&req, "receiving the failure notice of rank " + std::to_string(r));
  }
  for (MPI_Request& req : notices_->requests) wait(&req, "sending failure notices");
  notices_->requests.clear();
  // The next run on this Comm starts clean: a rank that fails again must notify again (without
  // this, its peers' finish_notices waited for a notice never sent, until the timeout aborted).
  notices_->sent = false;
}

}  // namespace dbrq::distributed
