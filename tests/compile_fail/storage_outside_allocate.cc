// A Storage is made by Storage::allocate or Storage::wrap only (they choose its allocator, which its
// destructor must match). Its constructor takes a key nobody else can make, not even as `{}`.
// expect-error: is private within this context
#include "core/storage.h"

int main() {
  dbrq::Storage s(dbrq::Storage::Private{});
  (void)s;
}
