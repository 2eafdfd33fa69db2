// Calibration across processes and machines on MPI (issue 15).
//
//   dbrq::distributed::MpiSession mpi(&argc, &argv);
//   dbrq::distributed::Comm comm;
//   std::shared_ptr<Net> model;
//   dbrq::distributed::Replica replica;
//   replica.prepare = [&]() -> dbrq::nn::Module& {           // every rank: its own replica
//     model = build();  dbrq::prepare(*model, {example});   // the same example on every rank
//     return *model;
//   };
//   replica.calibrate = [&](dbrq::nn::Module& m, dbrq::distributed::Shard& shard) {
//     for (int64_t i : shard.items(num_batches)) {           // rank r of n: r, r + n, ...
//       if (shard.stop_requested()) return;                   // another rank failed
//       m.forward_tensors({batch(i)});
//     }
//   };
//   dbrq::distributed::DistributedOptions options;
//   options.save_path = "model.qstate.json";                   // written once, by rank 0
//   dbrq::distributed::ReductionStats st = dbrq::distributed::calibrate(comm, replica, options);
//   dbrq::convert(*model);                                     // identical int8 model on every rank
//
// The reduction reuses what merge_calibration does between threads: each rank serializes its
// observer statistics and recorded paths (the quant-state document with statistics), rank 0
// gathers them and merges them one by one into its own replica (min/max exactly; histograms,
// percentile and entropy by re-binning onto the union range; paths seen on any rank united), then
// broadcasts the merged quantization parameters (the document without statistics), which every
// other rank loads: every rank converts with rank 0's parameters. The file is written by rank 0,
// after every rank agreed that everything before succeeded, through a temporary file and rename.
//
// Failures: an exception on any rank (in prepare, in the model, in loading its data) is caught,
// the other ranks are told at once (they stop after their current item), and all ranks meet in a
// vote: every rank then throws the same DistributedError naming each failed rank and its cause.
// A rank that hangs is caught by the Comm's timeout (MPI_Abort); one that dies is caught by
// mpirun. In no case is a file written.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distributed/comm.h"
#include "quant_state/save_options.h"
#include "runtime/module.h"

namespace dbrq::distributed {

// This rank's view of the work: which items are its own, and whether another rank failed.
class Shard {
 public:
  Shard(Comm& comm) : comm_(comm) {}
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  // Items r, r + n, r + 2n, ... below num_items (rank r of n).
  std::vector<int64_t> items(int64_t num_items) const;
  // True once another rank has failed: stop calibrating, the run fails anyway. Costs one
  // MPI_Iprobe (about a microsecond): call it between items.
  bool stop_requested() { return comm_.stop_requested(); }

 private:
  Comm& comm_;
};

struct Replica {
  // Builds and prepares this rank's replica; runs on every rank. Prepare every replica the same
  // way (same model, mapping and example): the example's own run is counted once, from rank 0.
  std::function<nn::Module&()> prepare;
  // Calls the prepared replica on this rank's shard.
  std::function<void(nn::Module&, Shard&)> calibrate;
};

enum class Reduction {
  // Binomial tree: in round k, rank r with r % 2^(k+1) == 2^k sends its (merged) statistics to
  // rank r - 2^k, which merges them: log2(n) rounds, the merges of a round run in parallel.
  kTree,
  // Every rank's statistics straight to rank 0, which merges them one after the other (n - 1
  // merges on one rank); simpler, and fine for a few ranks.
  kGather,
};

struct DistributedOptions {
  Reduction reduction = Reduction::kTree;
  // Written by rank 0 when not empty, atomically (PATH.tmp.<pid>, then renamed over PATH).
  std::string save_path;
  SaveQuantStateOptions save_options;
};

// What the reduction cost, measured on each rank (the gather and merge numbers are rank 0's).
struct ReductionStats {
  int rank = 0;
  int size = 1;
  double prepare_ms = 0;    // this rank's prepare
  double calibrate_ms = 0;  // this rank's shard
  double vote_ms = 0;       // the success vote after calibration (includes waiting for the slowest rank)
  double serialize_ms = 0;  // this rank's statistics to text
  double gather_ms = 0;     // statistics to rank 0 (tree: this rank's time in the reduction, merges excluded)
  double merge_ms = 0;      // merging other ranks' statistics on this rank (rank 0: and computing parameters)
  double broadcast_ms = 0;  // merged parameters to every rank
  double load_ms = 0;       // ranks other than 0: loading them
  double save_ms = 0;       // rank 0: writing the file (and the final vote)
  int64_t stats_bytes = 0;      // this rank's serialized statistics
  int64_t gathered_bytes = 0;   // statistics received from other ranks (rank 0, gather: from all)
  int64_t broadcast_bytes = 0;  // the merged parameters (sent to each other rank)
  // The reduction alone: serialize + gather + merge + broadcast + load (what 1 rank never pays).
  double reduction_ms() const { return serialize_ms + gather_ms + merge_ms + broadcast_ms + load_ms; }
};

// Runs on every rank of `comm`: prepares, calibrates the shard, reduces to rank 0, broadcasts
// the parameters and saves. Throws DistributedError (same message on every rank) when any rank
// failed; the file is then not written. With one rank it is a plain calibration.
ReductionStats calibrate(Comm& comm, const Replica& replica, const DistributedOptions& options = {});

// Writes `text` to `path` atomically: PATH.tmp.<pid>, flushed and fsync'ed, then renamed over
// PATH. Throws IOError (and leaves no temporary file) when any step fails.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace dbrq::distributed
