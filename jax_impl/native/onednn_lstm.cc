// oneDNN's LSTM primitive as XLA FFI handlers, one LSTM layer per call: the very kernel PyTorch's nn.LSTM runs on
// the CPU, reached through ATen's own entry points (at::cpu::mkldnn_rnn_layer and its backward), which link the
// oneDNN that torch ships (its symbols are not exported, ATen's are).
//
// Shapes (time-major, float32, PyTorch's layout and gate order i, f, g, o):
//   x (T, B, D), w_ih (4H, D), w_hh (4H, H), b_ih (4H,), b_hh (4H,), h0 and c0 (B, H)
//   forward:  y (T, B, H), h_T and c_T (B, H), and in training oneDNN's workspace (bytes) for the backward
//   backward: dy (T, B, H), dh_T and dc_T (B, H) -> dx, dw_ih, dw_hh, db (= d b_ih = d b_hh), dh0, dc0
//
// ATen allocates its results itself. So that nothing is copied, a handler hands ATen the XLA buffers it must fill
// (HandOff): the CPU allocator then returns those buffers for the allocations of exactly their sizes, in order.
// Where ATen allocated elsewhere anyway (another torch version), the handler copies, and the result is the same.
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mkldnn_rnn_layer_backward_cpu_dispatch.h>
#include <ATen/ops/mkldnn_rnn_layer_cpu_dispatch.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>

#include "xla/ffi/api/ffi.h"

#if __has_include(<oneapi/dnnl/dnnl_version.h>)
#include <oneapi/dnnl/dnnl_version.h>  // the headers of the oneDNN torch was built with
#endif

namespace ffi = xla::ffi;
using In1 = ffi::BufferR1<ffi::F32>;  // float32 inputs of rank 1, 2, 3
using In2 = ffi::BufferR2<ffi::F32>;
using In3 = ffi::BufferR3<ffi::F32>;
using Out0 = ffi::ResultBufferR0<ffi::F32>;
using Out1 = ffi::ResultBufferR1<ffi::F32>;
using Out2 = ffi::ResultBufferR2<ffi::F32>;
using Out3 = ffi::ResultBufferR3<ffi::F32>;
using Bytes = ffi::BufferR1<ffi::U8>;
using OutBytes = ffi::ResultBufferR1<ffi::U8>;

namespace {

constexpr int64_t kLstm = 2;  // ideep::rnn_kind::LSTM, as at::lstm passes it

// ---------------------------------------------------------------- handing XLA's buffers to ATen's allocations

thread_local std::deque<std::pair<size_t, void*>>* claims = nullptr;  // armed by HandOff on this thread only

// The XLA buffers handed out and not yet given back: freeing one is a no-op (XLA owns it). ATen's tensors free them
// through their own no-op deleter; this is for oneDNN's raw allocations, which go through raw_deleter().
std::mutex handed_mutex;
std::set<void*> handed;

void no_delete(void* p) {
  std::lock_guard<std::mutex> lock(handed_mutex);
  handed.erase(p);
}

c10::DeleterFnPtr base_raw_delete = nullptr;

void raw_delete(void* p) {
  {
    std::lock_guard<std::mutex> lock(handed_mutex);
    if (handed.erase(p)) return;
  }
  base_raw_delete(p);
}

struct HandOffAllocator final : c10::Allocator {
  c10::Allocator* base;
  explicit HandOffAllocator(c10::Allocator* fallback) : base(fallback) { base_raw_delete = base->raw_deleter(); }

  c10::DataPtr allocate(size_t n) override {
    if (claims != nullptr && !claims->empty() && claims->front().first == n) {
      void* p = claims->front().second;
      claims->pop_front();
      std::lock_guard<std::mutex> lock(handed_mutex);
      handed.insert(p);
      return {p, p, &no_delete, c10::Device(c10::DeviceType::CPU)};
    }
    return base->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_raw_delete ? &raw_delete : nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

void install_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static HandOffAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
  });
}

// While alive, ATen's allocations of these sizes, in this order, get these buffers.
class HandOff {
 public:
  explicit HandOff(std::deque<std::pair<size_t, void*>> wanted) : wanted_(std::move(wanted)) {
    install_allocator();
    claims = &wanted_;
  }
  ~HandOff() { claims = nullptr; }

 private:
  std::deque<std::pair<size_t, void*>> wanted_;
};

std::atomic<int64_t> copies{0};  // results ATen wrote elsewhere than into XLA's buffer

// `result` into the XLA buffer `out` (nothing to do where ATen already wrote there).
void deliver(const at::Tensor& result, void* out) {
  if (result.data_ptr() == out) return;
  std::memcpy(out, result.data_ptr(), result.nbytes());
  ++copies;
}

// ---------------------------------------------------------------- float rules and views

// Denormals flushed and read as zero on this thread and on every intra-op thread ATen's oneDNN computes on, as XLA
// does on its own threads: OpenMP threads keep the rule of the thread that started them, which may have kept
// denormals.
void flush_denormals_everywhere() {
  auto flush = [] { _mm_setcsr(_mm_getcsr() | 0x8040); };  // FTZ (bit 15) and DAZ (bit 6)
  flush();
  // Not at::parallel_for: on XLA's threads it may run inline while MKL's GEMM still spreads over its team.
  const int threads = std::max(at::get_num_threads(), omp_get_max_threads());
#pragma omp parallel num_threads(threads)
  flush();
}

// ---------------------------------------------------------------- one thread for ATen

// Every ATen call of this library runs on one thread of its own, whichever XLA thread asks: OpenMP keeps one team of
// threads per thread that starts parallel work, and teams of several XLA threads would spin-wait on the same two
// cores (measured by the bench: docs/benchmarks.md). PyTorch, too, calls oneDNN from one thread. The caller blocks
// (no spinning) until done. Before each call the thread takes ATen's intra-op thread count (torch.set_num_threads),
// as PyTorch's own worker threads do: OpenMP's count is per thread.
class AtenThread {
 public:
  template <typename F>
  auto run(F&& task) -> decltype(task()) {
    std::packaged_task<decltype(task())()> job(std::forward<F>(task));
    auto done = job.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.emplace_back([&job] { job(); });
    }
    ready_.notify_one();
    return done.get();
  }

  static AtenThread& instance() {
    static AtenThread* thread = new AtenThread();  // never destroyed: it outlives every caller, to process exit
    return *thread;
  }

 private:
  AtenThread() : worker_([this] { loop(); }) { worker_.detach(); }

  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      at::init_num_threads();
      job();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::thread worker_;
};

template <typename F>
auto on_aten_thread(F&& task) {
  return AtenThread::instance().run(std::forward<F>(task));
}

template <typename B>
at::Tensor view(B& buffer, std::initializer_list<int64_t> shape) {
  return at::from_blob(const_cast<void*>(static_cast<const void*>(buffer.typed_data())), shape,
                       at::TensorOptions().dtype(at::kFloat));
}

struct Dims {
  int64_t t, b, d, h;
};

Dims dims_of(In3& x, In2& w_hh) {
  auto xd = x.dimensions();
  return {xd[0], xd[1], xd[2], w_hh.dimensions()[1]};
}

size_t floats(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }

ffi::Error check(const Dims& d, In2& w_ih) {
  if (w_ih.dimensions()[0] != 4 * d.h || w_ih.dimensions()[1] != d.d)
    return ffi::Error::InvalidArgument("onednn_lstm: w_ih must be (4H, D)");
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- the handlers

ffi::Error Forward(In3 x, In2 w_ih, In2 w_hh,
                   In1 b_ih, In1 b_hh, In2 h0,
                   In2 c0, Out3 y, Out2 h_t,
                   Out2 c_t, OutBytes workspace, bool train) {
  const Dims d = dims_of(x, w_hh);
  if (auto err = check(d, w_ih); err.failure()) return err;
  return on_aten_thread([&]() -> ffi::Error {
    try {
      flush_denormals_everywhere();
      // oneDNN's training forward (which fills the workspace) runs where grad mode is on, its inference one elsewhere.
      c10::AutoGradMode grad_mode(train);
      std::deque<std::pair<size_t, void*>> wanted = {{floats(d.t * d.b * d.h), y->typed_data()},
                                                     {floats(d.b * d.h), h_t->typed_data()},
                                                     {floats(d.b * d.h), c_t->typed_data()}};
      if (train) wanted.emplace_back(workspace->element_count(), workspace->typed_data());
      HandOff handed(std::move(wanted));
      auto [out, h, c, ws] = at::cpu::mkldnn_rnn_layer(
          view(x, {d.t, d.b, d.d}), view(w_ih, {4 * d.h, d.d}), view(w_hh, {4 * d.h, d.h}), view(b_ih, {4 * d.h}),
          view(b_hh, {4 * d.h}), view(h0, {d.b, d.h}), view(c0, {d.b, d.h}), /*reverse=*/false, /*batch_sizes=*/{},
          kLstm, d.h, /*num_layers=*/1, /*has_biases=*/true, /*bidirectional=*/false, /*batch_first=*/false, train);
      deliver(out, y->typed_data());
      deliver(h, h_t->typed_data());
      deliver(c, c_t->typed_data());
      if (train) {
        if (static_cast<size_t>(ws.nbytes()) != workspace->element_count())
          return ffi::Error::Internal("onednn_lstm: the workspace is not the size queried at trace time");
        deliver(ws, workspace->typed_data());
      }
    } catch (const std::exception& e) {
      return ffi::Error::Internal(std::string("onednn_lstm forward: ") + e.what());
    }
    return ffi::Error::Success();
  });
}

ffi::Error Backward(In3 x, In2 w_ih, In2 w_hh,
                    In1 b_ih, In1 b_hh, In2 h0,
                    In2 c0, In3 y, In2 h_t,
                    In2 c_t, Bytes workspace, In3 dy,
                    In2 dh_t, In2 dc_t, Out3 dx,
                    Out2 dw_ih, Out2 dw_hh,
                    Out1 db, Out2 dh0,
                    Out2 dc0) {
  const Dims d = dims_of(x, w_hh);
  if (auto err = check(d, w_ih); err.failure()) return err;
  return on_aten_thread([&]() -> ffi::Error {
    try {
      flush_denormals_everywhere();
      HandOff handed({{floats(d.t * d.b * d.d), dx->typed_data()},
                      {floats(d.b * d.h), dh0->typed_data()},
                      {floats(d.b * d.h), dc0->typed_data()},
                      {floats(4 * d.h * d.d), dw_ih->typed_data()},
                      {floats(4 * d.h * d.h), dw_hh->typed_data()},
                      {floats(4 * d.h), db->typed_data()}});
      auto ws = at::from_blob(const_cast<uint8_t*>(workspace.typed_data()), {int64_t(workspace.element_count())},
                              at::TensorOptions().dtype(at::kByte));
      auto grads = at::cpu::mkldnn_rnn_layer_backward(
          view(x, {d.t, d.b, d.d}), view(w_ih, {4 * d.h, d.d}), view(w_hh, {4 * d.h, d.h}), view(b_ih, {4 * d.h}),
          view(b_hh, {4 * d.h}), view(h0, {d.b, d.h}), view(c0, {d.b, d.h}), view(y, {d.t, d.b, d.h}),
          view(h_t, {d.b, d.h}), view(c_t, {d.b, d.h}), view(dy, {d.t, d.b, d.h}), view(dh_t, {d.b, d.h}),
          view(dc_t, {d.b, d.h}), /*reverse=*/false, kLstm, d.h, /*num_layers=*/1, /*has_biases=*/true,
          /*train=*/true, /*bidirectional=*/false, /*batch_sizes=*/{}, /*batch_first=*/false, ws);
      deliver(std::get<0>(grads), dx->typed_data());
      deliver(std::get<1>(grads), dw_ih->typed_data());
      deliver(std::get<2>(grads), dw_hh->typed_data());
      deliver(std::get<3>(grads), db->typed_data());
      deliver(std::get<5>(grads), dh0->typed_data());
      deliver(std::get<6>(grads), dc0->typed_data());
    } catch (const std::exception& e) {
      return ffi::Error::Internal(std::string("onednn_lstm backward: ") + e.what());
    }
    return ffi::Error::Success();
  });
}

// The fraction of products of a 512² float32 GEMM of 1e-21 values (products 1e-42: denormal) that come out zero on
// ATen's threads under this library's float rules: 1 where every thread flushes.
ffi::Error DenormalsFlushed(Out0 zero_fraction) {
  zero_fraction->typed_data()[0] = on_aten_thread([] {
    flush_denormals_everywhere();
    auto a = at::full({512, 512}, 1e-21f, at::TensorOptions().dtype(at::kFloat));
    return at::mm(a, a).eq(0).to(at::kFloat).mean().item<float>();
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_forward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<In3>()  // x
                                  .Arg<In2>()  // w_ih
                                  .Arg<In2>()  // w_hh
                                  .Arg<In1>()  // b_ih
                                  .Arg<In1>()  // b_hh
                                  .Arg<In2>()  // h0
                                  .Arg<In2>()  // c0
                                  .Ret<In3>()  // y
                                  .Ret<In2>()  // h_T
                                  .Ret<In2>()  // c_T
                                  .Ret<Bytes>()   // workspace (empty in inference)
                                  .Attr<bool>("train"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_backward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<In3>()  // x
                                  .Arg<In2>()  // w_ih
                                  .Arg<In2>()  // w_hh
                                  .Arg<In1>()  // b_ih
                                  .Arg<In1>()  // b_hh
                                  .Arg<In2>()  // h0
                                  .Arg<In2>()  // c0
                                  .Arg<In3>()  // y
                                  .Arg<In2>()  // h_T
                                  .Arg<In2>()  // c_T
                                  .Arg<Bytes>()   // workspace
                                  .Arg<In3>()  // dy
                                  .Arg<In2>()  // dh_T
                                  .Arg<In2>()  // dc_T
                                  .Ret<In3>()  // dx
                                  .Ret<In2>()  // dw_ih
                                  .Ret<In2>()  // dw_hh
                                  .Ret<In1>()  // db
                                  .Ret<In2>()  // dh0
                                  .Ret<In2>());  // dc0

XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_denormals_flushed, DenormalsFlushed,
                              ffi::Ffi::Bind().Ret<ffi::BufferR0<ffi::F32>>());

// The bytes of oneDNN's training workspace for one layer of these sizes (JAX needs the residual's shape before the
// call): from one training call on zeros, the way ATen sizes it. -1 where ATen refuses.
extern "C" int64_t onednn_lstm_workspace_bytes(int64_t t, int64_t b, int64_t d, int64_t h) {
  return on_aten_thread([=]() -> int64_t {
    try {
      c10::AutoGradMode grad_mode(true);
      auto f = at::TensorOptions().dtype(at::kFloat);
      auto out = at::cpu::mkldnn_rnn_layer(at::zeros({t, b, d}, f), at::zeros({4 * h, d}, f), at::zeros({4 * h, h}, f),
                                           at::zeros({4 * h}, f), at::zeros({4 * h}, f), at::zeros({b, h}, f),
                                           at::zeros({b, h}, f), false, {}, kLstm, h, 1, true, false, false, true);
      return std::get<3>(out).nbytes();
    } catch (const std::exception&) {
      return -1;
    }
  });
}

// How many results so far had to be copied into XLA's buffers (0 while the hand-off works).
extern "C" int64_t onednn_lstm_copies() { return copies.load(); }

// ATen's intra-op threads, the ones oneDNN computes on.
extern "C" int64_t onednn_lstm_threads() {
  return on_aten_thread([] { return static_cast<int64_t>(at::get_num_threads()); });
}

// The oneDNN version ATen runs, as major * 10000 + minor * 100 + patch (for the bench's provenance).
extern "C" int64_t onednn_lstm_version() {
#ifdef DNNL_VERSION_MAJOR
  return DNNL_VERSION_MAJOR * 10000 + DNNL_VERSION_MINOR * 100 + DNNL_VERSION_PATCH;
#else
  return 0;
#endif
}
