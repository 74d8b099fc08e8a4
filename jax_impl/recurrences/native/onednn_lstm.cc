// oneDNN's LSTM primitive as XLA FFI handlers, one LSTM layer per call: the very kernel PyTorch's nn.LSTM runs on
// the CPU, reached through ATen's own entry points (at::cpu::mkldnn_rnn_layer and its backward), which link the
// oneDNN that torch ships (its symbols are not exported, ATen's are).
//
// Shapes (time-major, PyTorch's layout and gate order i, f, g, o), every float array float32, or bfloat16 in the
// *_bf16 handlers (what autocast hands mkldnn_rnn_layer: bfloat16 input, weights, biases, h0 and c0):
//   x (T, B, D), w_ih (4H, D), w_hh (4H, H), b_ih (4H,), b_hh (4H,), h0 and c0 (B, H)
//   forward:  y (T, B, H), h_T and c_T (B, H), and in training oneDNN's workspace (bytes) for the backward
//   backward: dy (T, B, H), dh_T and dc_T (B, H) -> dx, dw_ih, dw_hh, db (= d b_ih = d b_hh), dh0, dc0
//
// ATen allocates its results itself; each is copied into the XLA buffer that holds it (deliver). Nothing here changes
// PyTorch's process-wide state (its allocator, its settings): the library is loaded into programs of other people.
#include <omp.h>
#include <sys/mman.h>
#include <xmmintrin.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
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
#include <c10/core/GradMode.h>

#include "xla/ffi/api/ffi.h"

#if __has_include(<oneapi/dnnl/dnnl_version.h>)
#include <oneapi/dnnl/dnnl_version.h>  // the headers of the oneDNN torch was built with
#endif

namespace ffi = xla::ffi;
using Bytes = ffi::BufferR1<ffi::U8>;
using OutBytes = ffi::ResultBufferR1<ffi::U8>;

namespace {

constexpr int64_t kLstm = 2;  // ideep::rnn_kind::LSTM, as at::lstm passes it

// ---------------------------------------------------------------- results into XLA's buffers

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it, and the copy faults the pages in as before
#endif

// `result` into the XLA buffer `out` of element type `type`. A result of another type is rounded to the buffer's, as
// PyTorch's autograd rounds a gradient to its input's type: oneDNN's bfloat16 backward returns float32 gradients.
// XLA allocates its outputs afresh on every execution, so each chunk's destination pages are mapped in one call
// before its copy (not faulted in one by one as the copy first writes them), and the chunks are spread over ATen's
// intra-op threads.
void deliver(const at::Tensor& result, void* out, at::ScalarType type) {
  const at::Tensor typed = result.to(type).contiguous();
  const auto* from = static_cast<const char*>(typed.data_ptr());
  auto* to = static_cast<char*>(out);
  constexpr int64_t kPage = 4096, kChunk = 256 * kPage;
  const int64_t bytes = typed.nbytes();
  at::parallel_for(0, (bytes + kChunk - 1) / kChunk, 1, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kChunk, end = std::min(bytes, last * kChunk);
    const uintptr_t page_begin = (reinterpret_cast<uintptr_t>(to + begin) + kPage - 1) & ~uintptr_t(kPage - 1);
    const uintptr_t page_end = reinterpret_cast<uintptr_t>(to + end) & ~uintptr_t(kPage - 1);
    if (page_end > page_begin) madvise(reinterpret_cast<void*>(page_begin), page_end - page_begin, MADV_POPULATE_WRITE);
    std::memcpy(to + begin, from + begin, end - begin);
  });
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

// The element type of a handler's float arrays, in XLA's and ATen's terms.
template <ffi::DataType T>
struct Elem;
template <>
struct Elem<ffi::F32> {
  static constexpr at::ScalarType aten = at::kFloat;
};
template <>
struct Elem<ffi::BF16> {
  static constexpr at::ScalarType aten = at::kBFloat16;
};

template <typename B>
at::Tensor view(const B& buffer, std::initializer_list<int64_t> shape, at::ScalarType type) {
  return at::from_blob(buffer.untyped_data(), shape, at::TensorOptions().dtype(type));
}

struct Dims {
  int64_t t, b, d, h;
};

template <typename X, typename W>
Dims dims_of(const X& x, const W& w_hh) {
  auto xd = x.dimensions();
  return {xd[0], xd[1], xd[2], w_hh.dimensions()[1]};
}

template <typename W>
ffi::Error check(const Dims& d, const W& w_ih) {
  if (w_ih.dimensions()[0] != 4 * d.h || w_ih.dimensions()[1] != d.d)
    return ffi::Error::InvalidArgument("onednn_lstm: w_ih must be (4H, D)");
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- the handlers

template <ffi::DataType T>
ffi::Error Forward(ffi::BufferR3<T> x, ffi::BufferR2<T> w_ih, ffi::BufferR2<T> w_hh, ffi::BufferR1<T> b_ih,
                   ffi::BufferR1<T> b_hh, ffi::BufferR2<T> h0, ffi::BufferR2<T> c0, ffi::ResultBufferR3<T> y,
                   ffi::ResultBufferR2<T> h_t, ffi::ResultBufferR2<T> c_t, OutBytes workspace, bool train) {
  const Dims d = dims_of(x, w_hh);
  if (auto err = check(d, w_ih); err.failure()) return err;
  constexpr at::ScalarType type = Elem<T>::aten;
  return on_aten_thread([&]() -> ffi::Error {
    try {
      flush_denormals_everywhere();
      // oneDNN's training forward (which fills the workspace) runs where grad mode is on, its inference one elsewhere.
      c10::AutoGradMode grad_mode(train);
      auto [out, h, c, ws] = at::cpu::mkldnn_rnn_layer(
          view(x, {d.t, d.b, d.d}, type), view(w_ih, {4 * d.h, d.d}, type), view(w_hh, {4 * d.h, d.h}, type),
          view(b_ih, {4 * d.h}, type), view(b_hh, {4 * d.h}, type), view(h0, {d.b, d.h}, type),
          view(c0, {d.b, d.h}, type), /*reverse=*/false, /*batch_sizes=*/{}, kLstm, d.h, /*num_layers=*/1,
          /*has_biases=*/true, /*bidirectional=*/false, /*batch_first=*/false, train);
      deliver(out, y->untyped_data(), type);
      deliver(h, h_t->untyped_data(), type);
      deliver(c, c_t->untyped_data(), type);
      if (train) {
        if (static_cast<size_t>(ws.nbytes()) != workspace->element_count())
          return ffi::Error::Internal("onednn_lstm: the workspace is not the size queried at trace time");
        deliver(ws, workspace->untyped_data(), at::kByte);
      }
    } catch (const std::exception& err) {
      return ffi::Error::Internal(std::string("onednn_lstm forward: ") + err.what());
    }
    return ffi::Error::Success();
  });
}

template <ffi::DataType T>
ffi::Error Backward(ffi::BufferR3<T> x, ffi::BufferR2<T> w_ih, ffi::BufferR2<T> w_hh, ffi::BufferR1<T> b_ih,
                    ffi::BufferR1<T> b_hh, ffi::BufferR2<T> h0, ffi::BufferR2<T> c0, ffi::BufferR3<T> y,
                    ffi::BufferR2<T> h_t, ffi::BufferR2<T> c_t, Bytes workspace, ffi::BufferR3<T> dy,
                    ffi::BufferR2<T> dh_t, ffi::BufferR2<T> dc_t, ffi::ResultBufferR3<T> dx,
                    ffi::ResultBufferR2<T> dw_ih, ffi::ResultBufferR2<T> dw_hh, ffi::ResultBufferR1<T> db,
                    ffi::ResultBufferR2<T> dh0, ffi::ResultBufferR2<T> dc0) {
  const Dims d = dims_of(x, w_hh);
  if (auto err = check(d, w_ih); err.failure()) return err;
  constexpr at::ScalarType type = Elem<T>::aten;
  return on_aten_thread([&]() -> ffi::Error {
    try {
      flush_denormals_everywhere();
      auto ws = at::from_blob(workspace.untyped_data(), {int64_t(workspace.element_count())},
                              at::TensorOptions().dtype(at::kByte));
      auto grads = at::cpu::mkldnn_rnn_layer_backward(
          view(x, {d.t, d.b, d.d}, type), view(w_ih, {4 * d.h, d.d}, type), view(w_hh, {4 * d.h, d.h}, type),
          view(b_ih, {4 * d.h}, type), view(b_hh, {4 * d.h}, type), view(h0, {d.b, d.h}, type),
          view(c0, {d.b, d.h}, type), view(y, {d.t, d.b, d.h}, type), view(h_t, {d.b, d.h}, type),
          view(c_t, {d.b, d.h}, type), view(dy, {d.t, d.b, d.h}, type), view(dh_t, {d.b, d.h}, type),
          view(dc_t, {d.b, d.h}, type), /*reverse=*/false, kLstm, d.h, /*num_layers=*/1, /*has_biases=*/true,
          /*train=*/true, /*bidirectional=*/false, /*batch_sizes=*/{}, /*batch_first=*/false, ws);
      deliver(std::get<0>(grads), dx->untyped_data(), type);
      deliver(std::get<1>(grads), dw_ih->untyped_data(), type);
      deliver(std::get<2>(grads), dw_hh->untyped_data(), type);
      deliver(std::get<3>(grads), db->untyped_data(), type);
      deliver(std::get<5>(grads), dh0->untyped_data(), type);
      deliver(std::get<6>(grads), dc0->untyped_data(), type);
    } catch (const std::exception& err) {
      return ffi::Error::Internal(std::string("onednn_lstm backward: ") + err.what());
    }
    return ffi::Error::Success();
  });
}

// The fraction of products of a 512² float32 GEMM of 1e-21 values (products 1e-42: denormal) that come out zero on
// ATen's threads under this library's float rules: 1 where every thread flushes.
ffi::Error DenormalsFlushed(ffi::ResultBufferR0<ffi::F32> zero_fraction) {
  zero_fraction->typed_data()[0] = on_aten_thread([] {
    flush_denormals_everywhere();
    auto a = at::full({512, 512}, 1e-21f, at::TensorOptions().dtype(at::kFloat));
    return at::mm(a, a).eq(0).to(at::kFloat).mean().item<float>();
  });
  return ffi::Error::Success();
}

// The argument lists, in the order of the handlers' parameters. Both handlers take the layer's inputs first.
template <ffi::DataType T, typename Binding>
auto WithLayerInputs(Binding binding) {
  return std::move(binding).template Arg<ffi::BufferR3<T>>()  // x
      .template Arg<ffi::BufferR2<T>>()  // w_ih
      .template Arg<ffi::BufferR2<T>>()  // w_hh
      .template Arg<ffi::BufferR1<T>>()  // b_ih
      .template Arg<ffi::BufferR1<T>>()  // b_hh
      .template Arg<ffi::BufferR2<T>>()  // h0
      .template Arg<ffi::BufferR2<T>>();  // c0
}

template <ffi::DataType T>
auto ForwardBinding() {
  return WithLayerInputs<T>(ffi::Ffi::Bind())
      .template Ret<ffi::BufferR3<T>>()  // y
      .template Ret<ffi::BufferR2<T>>()  // h_T
      .template Ret<ffi::BufferR2<T>>()  // c_T
      .template Ret<Bytes>()  // workspace (empty in inference)
      .template Attr<bool>("train");
}

template <ffi::DataType T>
auto BackwardBinding() {
  return WithLayerInputs<T>(ffi::Ffi::Bind())
      .template Arg<ffi::BufferR3<T>>()  // y
      .template Arg<ffi::BufferR2<T>>()  // h_T
      .template Arg<ffi::BufferR2<T>>()  // c_T
      .template Arg<Bytes>()  // workspace
      .template Arg<ffi::BufferR3<T>>()  // dy
      .template Arg<ffi::BufferR2<T>>()  // dh_T
      .template Arg<ffi::BufferR2<T>>()  // dc_T
      .template Ret<ffi::BufferR3<T>>()  // dx
      .template Ret<ffi::BufferR2<T>>()  // dw_ih
      .template Ret<ffi::BufferR2<T>>()  // dw_hh
      .template Ret<ffi::BufferR1<T>>()  // db
      .template Ret<ffi::BufferR2<T>>()  // dh0
      .template Ret<ffi::BufferR2<T>>();  // dc0
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_forward, Forward<ffi::F32>, ForwardBinding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_forward_bf16, Forward<ffi::BF16>, ForwardBinding<ffi::BF16>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_backward, Backward<ffi::F32>, BackwardBinding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_backward_bf16, Backward<ffi::BF16>, BackwardBinding<ffi::BF16>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(onednn_lstm_denormals_flushed, DenormalsFlushed,
                              ffi::Ffi::Bind().Ret<ffi::BufferR0<ffi::F32>>());

// The bytes of oneDNN's training workspace for one layer of these sizes, in float32 or (bfloat16 != 0) bfloat16 (JAX
// needs the residual's shape before the call): from one training call on zeros, the way ATen sizes it. -1 where ATen
// refuses (bfloat16 on a CPU without oneDNN's bfloat16, for one).
extern "C" int64_t onednn_lstm_workspace_bytes(int64_t t, int64_t b, int64_t d, int64_t h, int64_t bfloat16) {
  return on_aten_thread([=]() -> int64_t {
    try {
      c10::AutoGradMode grad_mode(true);
      auto f = at::TensorOptions().dtype(bfloat16 ? at::kBFloat16 : at::kFloat);
      auto out = at::cpu::mkldnn_rnn_layer(at::zeros({t, b, d}, f), at::zeros({4 * h, d}, f),
                                           at::zeros({4 * h, h}, f), at::zeros({4 * h}, f), at::zeros({4 * h}, f),
                                           at::zeros({b, h}, f), at::zeros({b, h}, f), false, {}, kLstm, h, 1, true,
                                           false, false, true);
      return std::get<3>(out).nbytes();
    } catch (const std::exception&) {
      return -1;
    }
  });
}

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
