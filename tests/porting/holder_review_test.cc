// Review of the module holders for silent wrong results (issue 12): libtorch idioms that compiled
// and then ran outside the quantization hooks, or with a qconfig silently unapplied. Each case says
// what the old behaviour was (docs/porting_from_libtorch.md, "Holder pitfalls").
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// A user module with a functional op (the add) besides its layer.
struct ResidImpl : nn::CallableModule<ResidImpl> {
  explicit ResidImpl(int64_t n) { fc = register_module("fc", nn::Linear(n, n)); }
  Tensor forward(const Tensor& x) { return relu(fc(x)) + x; }
  nn::Linear fc{nullptr};
};
DBRQ_MODULE(Resid);

// The same as a libtorch-style class deriving from nn::Module (held as a HookedModule).
struct PlainResidImpl : nn::Module {
  explicit PlainResidImpl(int64_t n) { fc = register_module("fc", nn::Linear(n, n)); }
  Tensor forward(const Tensor& x) { return relu(fc(x)) + x; }
  nn::Linear fc{nullptr};
};
DBRQ_MODULE(PlainResid);

enum class Call { kHolder, kArrow, kPtrArrow, kPtrCopyArrow };

template <typename Block>
struct OuterImpl : nn::CallableModule<OuterImpl<Block>> {
  explicit OuterImpl(Call call) : call(call) { block = this->register_module("block", Block(4)); }
  Tensor forward(const Tensor& x) {
    switch (call) {
      case Call::kHolder:
        return block(x);
      case Call::kArrow:
        return block->forward(x);
      case Call::kPtrArrow:
        return block.ptr()->forward(x);
      case Call::kPtrCopyArrow: {
        auto p = block.ptr();  // as libtorch code keeps it
        return p->forward(x);
      }
    }
    return x;
  }
  Call call;
  Block block{nullptr};
};

// Ops that run int8 after convert, as "module:op".
std::vector<std::string> int8_ops(nn::Module& m) {
  std::vector<std::string> out;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.role != "fp32") out.push_back(op.module + ":" + op.op);
  }
  return out;
}

template <typename Block>
std::vector<std::string> int8_ops_with_block_off(Call call) {
  manual_seed(3);
  auto net = std::make_shared<OuterImpl<Block>>(call);
  net->eval();
  QConfigMapping mapping = default_qconfig_mapping("onednn");
  mapping.set_module_name("block", nullptr);  // the block stays fp32, whichever way it is called
  prepare(*net, {randn({3, 4}, 8)}, mapping);
  testing::calibrate(*net, {3, 4}, 4, 300);
  convert(*net);
  return int8_ops(*net);
}

// Every spelling of a call through a holder is the hooked call: the block's qconfig (None) applies
// to its add. Before, ptr()->forward ran ResidImpl::forward directly and the add ran int8 in the
// outer module (":add").
TEST(HolderReview, EveryHolderCallSpellingIsHooked) {
  for (Call call : {Call::kHolder, Call::kArrow, Call::kPtrArrow, Call::kPtrCopyArrow}) {
    EXPECT_EQ(int8_ops_with_block_off<Resid>(call), std::vector<std::string>{}) << static_cast<int>(call);
    EXPECT_EQ(int8_ops_with_block_off<PlainResid>(call), std::vector<std::string>{}) << static_cast<int>(call);
  }
  // The control: with the block quantized, the add runs int8 in the block's own state.
  manual_seed(3);
  auto net = std::make_shared<OuterImpl<Resid>>(Call::kPtrArrow);
  net->eval();
  prepare(*net, {randn({3, 4}, 8)});
  testing::calibrate(*net, {3, 4}, 4, 300);
  convert(*net);
  EXPECT_EQ(int8_ops(*net), (std::vector<std::string>{"block:linear+relu", "block:relu", "block:add"}));
}

// ptr() is the holder's object: registering it registers the holder's module, a holder made from
// it shares the module (libtorch's ModuleHolder(shared_ptr)), and it still converts to the Impl.
TEST(HolderReview, PtrIsTheHeldModule) {
  manual_seed(3);
  Resid a(4);
  Resid b(a.ptr());
  EXPECT_EQ(a.get(), b.get());
  std::shared_ptr<ResidImpl> impl = a.ptr();
  EXPECT_EQ(impl.get(), a.get());
  PlainResid p(4);
  auto owner = std::make_shared<OuterImpl<Resid>>(Call::kHolder);
  owner->register_module("again", a.ptr());
  owner->register_module("plain", p.ptr());
  EXPECT_EQ(owner->child("again").get(), a.get());
  EXPECT_EQ(owner->child("plain")->type_name(), "PlainResidImpl");
  const Tensor x = randn({3, 4}, 8);
  testing::expect_equal(a.ptr()->forward(x), a(x));
  testing::expect_equal(p.ptr()->forward(x), p(x));
}

// set_object_type with a user holder's name: a ValueError saying what to write, not a qconfig that
// silently matches nothing. The class spellings work.
TEST(HolderReview, ObjectTypeByUserHolderNameIsRefused) {
  {
    manual_seed(3);
    auto net = std::make_shared<OuterImpl<Resid>>(Call::kHolder);
    net->eval();
    QConfigMapping mapping = default_qconfig_mapping("onednn");
    mapping.set_object_type("Resid", nullptr);
    const std::string what = error_of<ValueError>([&] { prepare(*net, {randn({3, 4}, 8)}, mapping); });
    EXPECT_NE(what.find("set_object_type(\"Resid\") matches no module of the model (OuterImpl), which has modules "
                        "of class ResidImpl, named \"ResidImpl\""),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("set_object_type<Resid>(qconfig)"), std::string::npos) << what;
    EXPECT_FALSE(is_prepared(*net));
  }
  for (bool by_class : {true, false}) {
    manual_seed(3);
    auto net = std::make_shared<OuterImpl<Resid>>(Call::kHolder);
    net->eval();
    QConfigMapping mapping = default_qconfig_mapping("onednn");
    if (by_class) {
      mapping.set_object_type<Resid>(nullptr);
    } else {
      mapping.set_object_type("ResidImpl", nullptr);
    }
    // A built-in class the model does not have is fine (the default mapping lists such classes).
    mapping.set_object_type("Conv2d", nullptr);
    prepare(*net, {randn({3, 4}, 8)}, mapping);
    testing::calibrate(*net, {3, 4}, 4, 300);
    convert(*net);
    // The module's own ops stay fp32; its Linear layer keeps the global qconfig (an object type
    // applies to the class's functional ops, not to its layers: PyTorch FX's rule).
    EXPECT_EQ(int8_ops(*net), std::vector<std::string>{"block:linear"});
  }
}

// One holder registered under two names (libtorch allows it: both names reach one module).
struct TwiceImpl : nn::CallableModule<TwiceImpl> {
  TwiceImpl() {
    a = register_module("a", Resid(4));
    b = register_module("b", a);
  }
  Tensor forward(const Tensor& x) { return b(a(x)); }
  Resid a{nullptr}, b{nullptr};
};
DBRQ_MODULE(Twice);

TEST(HolderReview, ModuleUnderTwoNamesWithDifferentQConfigsIsRefused) {
  manual_seed(3);
  Twice t;
  t->eval();
  EXPECT_EQ(t->a.get(), t->b.get());
  QConfigMapping mapping = default_qconfig_mapping("onednn");
  mapping.set_module_name("b", nullptr);
  const std::string what = error_of<UsageError>([&] { prepare(*t, {randn({3, 4}, 8)}, mapping); });
  EXPECT_NE(what.find("prepare: the module \"a\" (ResidImpl) is also registered as \"b\", and the qconfig mapping "
                      "gives the two names different qconfigs"),
            std::string::npos)
      << what;
  EXPECT_FALSE(is_prepared(*t));
}

// With the same qconfig the shared module is prepared once, under its first name, and quantized.
TEST(HolderReview, ModuleUnderTwoNamesWithTheSameQConfigIsQuantized) {
  manual_seed(3);
  Twice t;
  t->eval();
  const Tensor x = randn({3, 4}, 8);
  const Tensor reference = t(x);
  prepare(*t, {x});
  testing::calibrate(*t, {3, 4}, 4, 300);
  convert(*t);
  EXPECT_EQ(int8_ops(*t), (std::vector<std::string>{"a:linear+relu", "a:relu", "a:add"}));
  EXPECT_GT(testing::sqnr_of(t(x), reference), 20.0);
}

// A holder member assigned a new module after register_module: as in libtorch the model keeps the
// registered module, and forward calls the new one, whose weights state_dict / load_state_dict never
// see. Under prepare that call ran silently in fp32, unrecorded; now it is a UsageError.
struct ReassignedImpl : nn::CallableModule<ReassignedImpl> {
  explicit ReassignedImpl(bool reassign) {
    fc = register_module("fc", nn::Linear(4, 4));
    if (reassign) fc = nn::Linear(4, 4);
  }
  // A parameter-free module made in forward is fine (it runs fp32, as before).
  Tensor forward(const Tensor& x) { return nn::Sigmoid()(relu(fc(x))); }
  nn::Linear fc{nullptr};
};
DBRQ_MODULE(Reassigned);

TEST(HolderReview, UnregisteredModuleWithParametersIsRefused) {
  manual_seed(3);
  Reassigned bad(true);
  bad->eval();
  EXPECT_EQ(bad->named_parameters().size(), 2u);  // the registered fc only
  EXPECT_NE(bad->child("fc").get(), bad->fc.get());
  const std::string what = error_of<UsageError>([&] { prepare(*bad, {randn({3, 4}, 8)}); });
  EXPECT_NE(what.find("a Linear module with parameters was called from module \"\" (ReassignedImpl), but it is "
                      "not part of the prepared model"),
            std::string::npos)
      << what;
  EXPECT_FALSE(is_prepared(*bad));
  // The control: registered, it prepares and its linear runs int8.
  manual_seed(3);
  Reassigned good(false);
  good->eval();
  const Tensor x = randn({3, 4}, 8);
  const Tensor reference = good(x);
  prepare(*good, {x});
  testing::calibrate(*good, {3, 4}, 4, 300);
  convert(*good);
  EXPECT_EQ(int8_ops(*good), (std::vector<std::string>{":linear+relu", ":relu"}));
  EXPECT_GT(testing::sqnr_of(good(x), reference), 20.0);
}

// `m->as<X>()->forward(x)` and `list->at<X>(i)->forward(x)` return the Impl (libtorch's types), whose
// forward is the body: the block's ops are recorded in the caller. When the block's qconfig differs
// from the caller's, prepare now says so (before: the block's add silently ran int8 in the caller).
struct ListOuterImpl : nn::CallableModule<ListOuterImpl> {
  explicit ListOuterImpl(int how) : how(how) {
    block = register_module("block", Resid(4));
    list = register_module("list", nn::ModuleList());
    list->push_back(Resid(4));
  }
  Tensor forward(const Tensor& x) {
    switch (how) {
      case 0:
        return child("block")->as<Resid>()->forward(x);
      case 1:
        return list->at<Resid>(0)->forward(x);
      case 2:
        return list->ptr<Resid>(0)->forward(x);
      default:  // the hooked spellings of the same
        return (*list->at<Resid>(0))(list[0]->forward_unary((*child("block")->as<Resid>())(x)));
    }
  }
  int how;
  Resid block{nullptr};
  nn::ModuleList list{nullptr};
};
DBRQ_MODULE(ListOuter);

TEST(HolderReview, DirectForwardOfAUserModuleWithItsOwnQConfigIsRefused) {
  for (int how : {0, 1, 2}) {
    manual_seed(3);
    ListOuter net(how);
    net->eval();
    QConfigMapping mapping = default_qconfig_mapping("onednn");
    mapping.set_module_name(how == 0 ? "block" : "list.0", nullptr);
    const std::string what = error_of<UsageError>([&] { prepare(*net, {randn({3, 4}, 8)}, mapping); });
    const std::string parent = how == 0 ? "block" : "list.0";
    EXPECT_NE(what.find("module \"" + parent + ".fc\" runs inside module \"\" (ListOuterImpl) while its parent \"" +
                        parent + "\" (ResidImpl) is not being called"),
              std::string::npos)
        << what;
    EXPECT_FALSE(is_prepared(*net));
    // With the same qconfig nothing differs: prepared, the block's ops recorded in the caller.
    manual_seed(3);
    ListOuter same(how);
    same->eval();
    prepare(*same, {randn({3, 4}, 8)});
    testing::calibrate(*same, {3, 4}, 4, 300);
    convert(*same);
    EXPECT_EQ(int8_ops(*same), (std::vector<std::string>{":linear+relu", ":relu", ":add"}));
  }
  // The hooked spellings with the block and the list fp32: nothing runs int8.
  manual_seed(3);
  ListOuter hooked(3);
  hooked->eval();
  QConfigMapping mapping = default_qconfig_mapping("onednn");
  mapping.set_module_name("block", nullptr).set_module_name("list", nullptr);
  prepare(*hooked, {randn({3, 4}, 8)}, mapping);
  testing::calibrate(*hooked, {3, 4}, 4, 300);
  convert(*hooked);
  EXPECT_EQ(int8_ops(*hooked), std::vector<std::string>{});
}

}  // namespace
}  // namespace dbrq
