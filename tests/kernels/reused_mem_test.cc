// kernels::reused_mem: a oneDNN memory object per (desc object, argument) and thread, pointed at
// each call's tensor. Two arguments never share one, a desc changed in place gets a new one, and
// another thread gets its own.
#include <gtest/gtest.h>

#include <thread>

#include "kernels/dnnl_utils.h"

namespace dbrq::kernels {
namespace {

TEST(ReusedMem, OneObjectPerDescAndArgumentPointedAtEachCallsTensor) {
  const Tensor a = Tensor::empty({4, 8}, DType::kU8), b = Tensor::empty({4, 8}, DType::kU8);
  const dnnl::memory::desc d = desc_of(a);
  dnnl::memory first = reused_mem(d, DNNL_ARG_SRC, a);
  EXPECT_EQ(first.get_data_handle(), a.data_ptr());
  // The same desc object and argument: the same object, now over b.
  dnnl::memory again = reused_mem(d, DNNL_ARG_SRC, b);
  EXPECT_EQ(again.get(), first.get());
  EXPECT_EQ(again.get_data_handle(), b.data_ptr());
  // Another argument of the same call, same desc: its own object; the source keeps pointing at b.
  dnnl::memory dst = reused_mem(d, DNNL_ARG_DST, a);
  EXPECT_NE(dst.get(), again.get());
  EXPECT_EQ(dst.get_data_handle(), a.data_ptr());
  EXPECT_EQ(again.get_data_handle(), b.data_ptr());
  // An equal desc at another address: another object.
  const dnnl::memory::desc copy = d;
  EXPECT_NE(reused_mem(copy, DNNL_ARG_SRC, a).get(), first.get());
}

TEST(ReusedMem, ADescChangedAtTheSameAddressGetsAnObjectOfItsShape) {
  const Tensor small = Tensor::empty({2, 3}, DType::kF32), big = Tensor::empty({5, 7}, DType::kF32);
  dnnl::memory::desc d = desc_of(small);
  const dnnl::memory m1 = reused_mem(d, DNNL_ARG_SRC, small);
  EXPECT_EQ(m1.get_desc(), desc_of(small));
  d = desc_of(big);  // as when a cache entry is freed and another is made at its address
  const dnnl::memory m2 = reused_mem(d, DNNL_ARG_SRC, big);
  EXPECT_EQ(m2.get_desc(), desc_of(big));
  EXPECT_EQ(m2.get_data_handle(), big.data_ptr());
  EXPECT_EQ(m1.get_desc(), desc_of(small));  // a handle taken before is not changed under its holder
}

TEST(ReusedMem, EachThreadHasItsOwnObjects) {
  const Tensor a = Tensor::empty({16}, DType::kF32), b = Tensor::empty({16}, DType::kF32);
  const dnnl::memory::desc d = desc_of(a);
  const dnnl::memory here = reused_mem(d, DNNL_ARG_SRC, a);
  dnnl_memory_t there = nullptr;
  std::thread([&] { there = reused_mem(d, DNNL_ARG_SRC, b).get(); }).join();
  EXPECT_NE(there, here.get());
  EXPECT_EQ(here.get_data_handle(), a.data_ptr());  // the other thread did not repoint this one
}

}  // namespace
}  // namespace dbrq::kernels
