// ThreadSanitizer suppressions for the libraries the sanitizer cannot see into, compiled into the
// tsan-tagged test binaries (the runtime calls __tsan_default_suppressions at startup).
//
// libgomp (GCC's OpenMP runtime) and libdnnl (oneDNN, built against libgomp) come from Debian
// packages and are not instrumented. OpenMP worker threads are pooled and handed each parallel
// region through spinning barriers and futexes that TSan does not model, so what a worker reads
// (in dbrq's own parallel loop bodies, or in oneDNN's memset / memcpy through the sanitizer's
// interceptors) looks unsynchronized with what the calling thread wrote before the region.
//
// The tsan config in .bazelrc runs OpenMP with one thread per calling thread (OMP_NUM_THREADS=1):
// then no worker thread exists and neither line matches anything (measured: TSan reports no
// matched suppressions). They are here for runs with more OpenMP threads (with 2, some 28,000
// reports, every one with a libgomp frame, are suppressed), where TSan cannot tell these apart
// from a real race inside a parallel loop; that is why CI keeps OpenMP at one thread. A race
// whose stacks have no frame in these libraries is always reported.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libgomp.so.1\n"
         "race:libdnnl.so.2\n";
}
