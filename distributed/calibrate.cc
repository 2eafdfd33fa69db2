#include "distributed/calibrate.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "tracer/internal.h"
#include "tracer/quantize.h"

namespace dbrq::distributed {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string kind_of(const std::exception& e) {
  int status = 0;
  char* d = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string name = status == 0 && d != nullptr ? d : typeid(e).name();
  std::free(d);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// Runs `f`; an exception becomes this rank's failed status ("<stage>: ShapeError: <message>").
template <typename F>
RankStatus attempt(const std::string& stage, F&& f) {
  RankStatus s;
  try {
    f();
  } catch (const std::exception& e) {
    s.ok = false;
    s.message = absl::StrCat(stage, ": ", kind_of(e), ": ", e.what());
  } catch (...) {
    s.ok = false;
    s.message = stage + ": unknown exception";
  }
  return s;
}

// What prepare's example run added to the recorded paths (the same on every rank): the other
// ranks take it out of what they send, so the merged state counts it once, as one process does.
struct Baseline {
  std::vector<std::vector<PathInfo>> paths;  // per module with state, in ModelQuantState::states() order
  uint64_t calls = 0;
};

Baseline snapshot(ModelQuantState& m) {
  Baseline b;
  for (AutoQuantizationState* s : m.states()) b.paths.push_back(s->paths());
  b.calls = m.call_count();
  return b;
}

void subtract(ModelQuantState& m, const Baseline& b) {
  for (size_t i = 0; i < m.states().size() && i < b.paths.size(); ++i) {
    std::vector<PathInfo> paths = m.states()[i]->paths();
    for (const PathInfo& base : b.paths[i]) {
      for (PathInfo& p : paths) {
        if (p.mask == base.mask) p.calls -= std::min(p.calls, base.calls);
      }
    }
    m.states()[i]->set_paths(std::move(paths));
  }
  m.set_call_count(m.call_count() - std::min(m.call_count(), b.calls));
}

// Messages between ranks: 'D' + a document, or 'E' + why there is none.
std::string framed(char tag, const std::string& body) { return std::string(1, tag) + body; }

}  // namespace

std::vector<int64_t> Shard::items(int64_t num_items) const {
  std::vector<int64_t> out;
  for (int64_t i = rank(); i < num_items; i += size()) out.push_back(i);
  return out;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DBRQ_ENSURE(fd >= 0, IOError, "cannot open \"", tmp, "\" for writing (for \"", path, "\")");
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) ok = false; else done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    DBRQ_THROW(IOError, "failed writing \"", tmp, "\" (for \"", path, "\")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    DBRQ_THROW(IOError, "cannot rename \"", tmp, "\" to \"", path, "\"");
  }
}

ReductionStats calibrate(Comm& comm, const Replica& replica, const DistributedOptions& options) {
  DBRQ_ENSURE(replica.prepare != nullptr && replica.calibrate != nullptr, ValueError,
              "distributed::calibrate: Replica needs both prepare and calibrate");
  ReductionStats st;
  st.rank = comm.rank();
  st.size = comm.size();
  const bool root = comm.rank() == 0;

  // 1. Prepare and calibrate this rank's shard. Any failure tells the other ranks at once.
  nn::Module* model = nullptr;
  Baseline baseline;
  auto t = Clock::now();
  RankStatus mine = attempt("prepare", [&] {
    model = &replica.prepare();
    DBRQ_ENSURE(is_prepared(*model) && !is_converted(*model), UsageError,
                "Replica::prepare must return a prepared model that is not converted");
    ModelQuantState& m = model_quant_state(*model);
    DBRQ_ENSURE(m.call_count() == 0, UsageError, "the replica was called ", m.call_count(),
                " times after prepare; Replica::prepare must return a freshly prepared model");
    baseline = snapshot(m);
  });
  st.prepare_ms = ms_since(t);
  t = Clock::now();
  if (mine.ok) {
    Shard shard(comm);
    mine = attempt("calibrate", [&] { replica.calibrate(*model, shard); });
  }
  st.calibrate_ms = ms_since(t);
  if (!mine.ok) comm.notify_failure();
  t = Clock::now();
  const std::vector<RankStatus> all = comm.agree(mine, "calibration vote");
  comm.finish_notices(all);
  st.vote_ms = ms_since(t);
  const std::string failures = describe_failures(all);
  DBRQ_ENSURE(failures.empty(), DistributedError, "distributed calibration failed on ", failures);

  ModelQuantState& m = model_quant_state(*model);
  const std::string type = model->type_name();

  // 2./3. Statistics (with paths) reduced to rank 0, which turns them into parameters. Messages
  //       are 'D' + a document with statistics, or 'E' + "rank r of n: <what failed>".
  SaveQuantStateOptions with_stats;
  with_stats.include_observer_stats = true;
  const std::string who = absl::StrCat("rank ", comm.rank(), " of ", comm.size(), ": ");
  std::string errors;  // of this rank and of what it received
  auto add_error = [&](const std::string& e) { absl::StrAppend(&errors, errors.empty() ? "" : "; ", e); };
  auto merge_in = [&](const std::string& d, int from) {
    st.gathered_bytes += static_cast<int64_t>(d.size());
    if (d.empty() || d[0] != 'D') {
      add_error(d.empty() ? absl::StrCat("rank ", from, " of ", comm.size(), ": no statistics") : d.substr(1));
      return;
    }
    if (!errors.empty()) return;  // the run fails anyway
    const auto t0 = Clock::now();
    const RankStatus s = attempt("merge", [&] {
      merge_quant_state(m, type, d.substr(1), absl::StrCat("(statistics of rank ", from, ")"));
    });
    st.merge_ms += ms_since(t0);
    if (!s.ok) add_error(who + s.message);
  };
  auto serialized = [&]() {
    const auto t0 = Clock::now();
    std::string doc;
    if (errors.empty()) {
      const RankStatus s = attempt("serialize", [&] { doc = framed('D', quant_state_to_json(m, type, with_stats)); });
      if (!s.ok) add_error(who + s.message);
    }
    if (!errors.empty()) doc = framed('E', errors);
    st.serialize_ms += ms_since(t0);
    st.stats_bytes = static_cast<int64_t>(doc.size());
    return doc;
  };
  if (!root) {
    const RankStatus s = attempt("serialize", [&] { subtract(m, baseline); });
    if (!s.ok) add_error(who + s.message);
  }
  t = Clock::now();
  if (options.reduction == Reduction::kGather) {
    const std::vector<std::string> docs = comm.gather(root ? std::string() : serialized(), 0, "gathering statistics");
    if (root) {
      for (int r = 1; r < comm.size(); ++r) merge_in(docs[static_cast<size_t>(r)], r);
    }
  } else {
    for (int step = 1; step < comm.size(); step *= 2) {
      if (comm.rank() % (2 * step) == step) {
        comm.send(serialized(), comm.rank() - step, "reducing statistics");
        break;
      }
      if (comm.rank() + step < comm.size()) merge_in(comm.receive(comm.rank() + step, "reducing statistics"), comm.rank() + step);
    }
  }
  st.gather_ms = ms_since(t) - st.merge_ms - st.serialize_ms;
  std::string reply, file_text;
  if (root) {
    t = Clock::now();
    if (errors.empty()) {
      const RankStatus s = attempt("parameters", [&] {
        file_text = quant_state_to_json(m, type, options.save_options);
        reply = framed('D', quant_state_to_json(m, type));  // parameters only: what convert needs
      });
      if (!s.ok) add_error(who + s.message);
    }
    if (!errors.empty()) reply = framed('E', errors);
    st.merge_ms += ms_since(t);
  }

  // 4. Rank 0's parameters to every rank, which load them (and so convert identically).
  t = Clock::now();
  const std::string params = comm.broadcast(reply, 0, "broadcasting parameters");
  st.broadcast_ms = ms_since(t);
  st.broadcast_bytes = static_cast<int64_t>(params.size());
  DBRQ_ENSURE(!params.empty() && params[0] == 'D', DistributedError, "distributed calibration failed on ",
              params.empty() ? std::string("rank 0: no parameters") : params.substr(1));
  t = Clock::now();
  RankStatus loaded;
  if (!root) {
    loaded = attempt("load parameters", [&] {
      quant_state_from_json(m, type, params.substr(1), "(the merged parameters from rank 0)");
    });
  }
  st.load_ms = ms_since(t);
  comm.agree_or_throw(loaded, "distributed calibration");

  // 5. One file, written by rank 0 once every rank holds the parameters; the last vote tells
  //    every rank whether it was written.
  t = Clock::now();
  RankStatus saved;
  if (root && !options.save_path.empty()) {
    saved = attempt("save", [&] { write_file_atomically(options.save_path, file_text); });
  }
  comm.agree_or_throw(saved, "distributed calibration");
  st.save_ms = ms_since(t);
  return st;
}

}  // namespace dbrq::distributed
