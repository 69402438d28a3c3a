#include "data/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/file_io.h"
#include "base/random.h"
#include "data/example.h"
#include "data/pipeline_state.h"
#include "data/tfrecord.h"

namespace paraflow::data {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<size_t> auto_shard_files(size_t num_files, int num_workers, int index) {
  check(num_workers >= 1 && index >= 0 && index < num_workers, "auto-shard: worker index {} of {} workers", index,
        num_workers);
  std::vector<size_t> out;
  for (size_t i = static_cast<size_t>(index); i < num_files; i += static_cast<size_t>(num_workers)) out.push_back(i);
  return out;
}

namespace {

uint64_t mix(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xD1B54A32D192ED03ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
constexpr uint64_t kFileOrderTag = 1, kShuffleTag = 2;

struct Record {
  uint32_t file = 0;
  uint64_t offset = 0, end = 0;  // [offset, end): the record's bytes in the (uncompressed) file
  std::vector<int32_t> tokens;
};

struct FileReader {
  int64_t g = 0;
  uint32_t file = 0;
  uint64_t start = 0;
  std::unique_ptr<TFRecordReader> reader;
  std::deque<Record> queue;
  int64_t queued_tokens = 0;
  bool exhausted = false, busy = false, in_cycle = false;
  // A read or parse failure, raised when the sequencer reaches it (after the records before it):
  // read-ahead does not decide at which batch the failure shows.
  std::exception_ptr error;
};

struct Stopped {};

Compression compression_of(const fs::path& path, const std::optional<Compression>& forced) {
  return forced ? *forced : detect_compression(path);
}

}  // namespace

struct InputPipeline::Impl {
  std::vector<fs::path> files;
  std::vector<Compression> compressions;
  PipelineOptions opt;
  int64_t n = 0;       // files
  int64_t L = 0;       // tokens per sample
  int C = 0;           // cycle length
  int64_t S = 1;       // shuffle buffer
  int64_t g_max = 0;   // file stream end (num_epochs · n), or "infinite"
  std::string fingerprint;
  int max_par = 1;
  bool autotune = false;
  size_t queue_records = 256;
  int64_t queue_tokens = 1 << 20;

  // ---- shared between workers and the sequencer (mu) ----
  mutable std::mutex mu;
  std::condition_variable work_cv, data_cv;
  std::map<int64_t, FileReader> readers;
  std::atomic<bool> stop{false};  // set under mu and out_mu, so waits on either see it
  std::exception_ptr error;
  std::atomic<int> parallelism{1};
  std::atomic<int64_t> records_parsed{0}, tokens_parsed{0};

  // ---- sequencer thread only ----
  int64_t epoch = 0, next_batch = 0, next_g = 0, epoch_tokens = 0;
  std::vector<int64_t> slots;
  std::vector<uint64_t> slot_offsets;
  int cycle_index = 0;
  bool filling = true;
  Rng rng;
  std::vector<Record> buffer;
  int64_t carry = -1;
  std::optional<Record> current;
  size_t pos = 0;
  std::map<int64_t, std::vector<uint32_t>> perms;

  // ---- prefetch queue (out_mu) ----
  struct Batch {
    std::vector<int32_t> tokens;
    SeqState state;
    bool end = false;
  };
  std::mutex out_mu;
  std::condition_variable out_cv, room_cv;
  std::deque<Batch> out;
  std::vector<std::vector<int32_t>> free_buffers;

  std::vector<std::thread> workers;
  std::thread sequencer;
  bool started = false;

  // ---- consumer ----
  SeqState consumer_state;
  std::vector<int32_t> batch;
  int64_t current_index = -1;  // index of `batch`, -1 if none
  bool ended = false;
  int64_t batches = 0;
  double wait_seconds = 0;
  double window_wait = 0;
  int64_t window_batches = 0;
  std::chrono::steady_clock::time_point window_start;
  mutable std::mutex max_mu;
  mutable std::optional<int32_t> max_token_cache;

  // ------------------------------------------------------------------ order helpers
  SeqState initial_state() const {
    SeqState s;
    s.slots.assign(static_cast<size_t>(C), -1);
    s.slot_offsets.assign(static_cast<size_t>(C), 0);
    s.rng = Rng(mix(opt.seed, kShuffleTag, 0)).state();
    return s;
  }

  uint32_t file_of(int64_t g) {
    int64_t e = g / n;
    auto it = perms.find(e);
    if (it == perms.end()) {
      std::vector<uint32_t> perm(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
      if (opt.shuffle_files) {
        Rng r(mix(opt.seed, kFileOrderTag, static_cast<uint64_t>(e)));
        for (int64_t i = n - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[r.below(static_cast<uint64_t>(i + 1))]);
      }
      while (perms.size() > 2) perms.erase(perms.begin());
      it = perms.emplace(e, std::move(perm)).first;
    }
    return it->second[static_cast<size_t>(g % n)];
  }

  // mu held (or threads stopped).
  FileReader& ensure_reader(int64_t g, uint64_t offset) {
    auto [it, inserted] = readers.try_emplace(g);
    if (inserted) {
      it->second.g = g;
      it->second.file = file_of(g);
      it->second.start = offset;
    }
    return it->second;
  }
  void extend_lookahead() {
    for (int64_t g = next_g; g < next_g + C && g < g_max; ++g) ensure_reader(g, 0);
  }

  // Reads one record's tokens: parse, range check, map.
  void parse(std::string_view bytes, uint32_t file, uint64_t offset, std::vector<int64_t>& scratch,
             std::vector<int32_t>& tokens) const {
    std::string name = files[file].string();
    decode_int64_feature(bytes, opt.feature, scratch, RecordSource{name, offset});
    const int64_t bound = opt.vocab_size > 0 ? opt.vocab_size : std::numeric_limits<int32_t>::max();
    tokens.resize(scratch.size());
    for (size_t i = 0; i < scratch.size(); ++i) {
      int64_t v = scratch[i];
      if (v < 0 || v >= bound) {
        fail("{}: record at byte offset {}: token {} is outside [0, {})", name, offset, v, bound);
      }
      tokens[i] = static_cast<int32_t>(v);
    }
    if (opt.map) opt.map(tokens);
  }

  std::unique_ptr<TFRecordReader> open(uint32_t file) const {
    TFRecordReaderOptions ro;
    ro.compression = compressions[file];
    return std::make_unique<TFRecordReader>(files[file], ro);
  }

  // Reads referenced records (the shuffle buffer of a state), each file in offset order.
  std::vector<Record> read_refs(const std::vector<Ref>& refs) const {
    std::map<uint32_t, std::vector<size_t>> by_file;
    for (size_t i = 0; i < refs.size(); ++i) {
      check(refs[i].file < files.size(), "pipeline state: file index {} out of range", refs[i].file);
      by_file[refs[i].file].push_back(i);
    }
    std::vector<Record> out(refs.size());
    std::vector<int64_t> scratch;
    for (auto& [file, idx] : by_file) {
      std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return refs[a].offset < refs[b].offset; });
      auto reader = open(file);
      for (size_t i : idx) {
        reader->seek(refs[i].offset);
        auto bytes = reader->next();
        check(bytes.has_value(), "pipeline state: {} has no record at byte offset {}", files[file].string(),
              refs[i].offset);
        out[i].file = file;
        out[i].offset = refs[i].offset;
        out[i].end = reader->offset();
        parse(*bytes, file, refs[i].offset, scratch, out[i].tokens);
      }
    }
    return out;
  }

  // ------------------------------------------------------------------ workers
  FileReader* pick() {
    FileReader* best = nullptr;
    for (auto& [g, fr] : readers) {
      if (fr.busy || fr.exhausted || fr.error || fr.queue.size() >= queue_records || fr.queued_tokens >= queue_tokens) {
        continue;
      }
      if (!best || (fr.in_cycle && !best->in_cycle) ||
          (fr.in_cycle == best->in_cycle && fr.queue.size() < best->queue.size())) {
        best = &fr;
      }
    }
    return best;
  }

  void worker_main(int id) {
    std::vector<int64_t> scratch;
    std::vector<Record> got;
    for (;;) {
      FileReader* fr = nullptr;
      {
        std::unique_lock lock(mu);
        work_cv.wait(lock, [&] { return stop || (id < parallelism.load() && (fr = pick()) != nullptr); });
        if (stop) return;
        fr->busy = true;
      }
      bool eof = false;
      std::exception_ptr failure;
      got.clear();
      try {
        if (!fr->reader) {
          fr->reader = open(fr->file);
          if (fr->start > 0) fr->reader->seek(fr->start);
        }
        int64_t chunk_tokens = 0;
        for (int k = 0; k < 32 && chunk_tokens < (1 << 16); ++k) {
          auto bytes = fr->reader->next();
          if (!bytes) {
            eof = true;
            break;
          }
          Record r;
          r.file = fr->file;
          r.offset = fr->reader->record_offset();
          r.end = fr->reader->offset();
          parse(*bytes, r.file, r.offset, scratch, r.tokens);
          chunk_tokens += static_cast<int64_t>(r.tokens.size());
          got.push_back(std::move(r));
        }
        records_parsed += static_cast<int64_t>(got.size());
        tokens_parsed += chunk_tokens;
      } catch (...) {
        failure = std::current_exception();  // the records read before it are queued first
      }
      {
        std::lock_guard lock(mu);
        for (auto& r : got) {
          fr->queued_tokens += static_cast<int64_t>(r.tokens.size());
          fr->queue.push_back(std::move(r));
        }
        fr->exhausted = eof;
        fr->error = failure;
        fr->busy = false;
      }
      data_cv.notify_all();
      work_cv.notify_all();
    }
  }

  // ------------------------------------------------------------------ sequencer
  std::optional<Record> next_interleaved() {
    const int64_t epoch_end = (epoch + 1) * n;
    for (;;) {
      int64_t g = slots[static_cast<size_t>(cycle_index)];
      if (g >= 0) {
        std::unique_lock lock(mu);
        FileReader& fr = readers.at(g);
        data_cv.wait(lock, [&] { return stop || error || !fr.queue.empty() || fr.exhausted || fr.error; });
        if (stop || error) throw Stopped{};
        if (fr.queue.empty() && fr.error) std::rethrow_exception(fr.error);
        if (!fr.queue.empty()) {
          Record r = std::move(fr.queue.front());
          fr.queue.pop_front();
          fr.queued_tokens -= static_cast<int64_t>(r.tokens.size());
          lock.unlock();
          work_cv.notify_all();
          slot_offsets[static_cast<size_t>(cycle_index)] = r.end;
          cycle_index = (cycle_index + 1) % C;
          epoch_tokens += static_cast<int64_t>(r.tokens.size());
          return r;
        }
        readers.erase(g);
        slots[static_cast<size_t>(cycle_index)] = -1;
        cycle_index = (cycle_index + 1) % C;
        continue;
      }
      if (next_g < epoch_end) {
        g = next_g++;
        slots[static_cast<size_t>(cycle_index)] = g;
        slot_offsets[static_cast<size_t>(cycle_index)] = 0;
        {
          std::lock_guard lock(mu);
          ensure_reader(g, 0).in_cycle = true;
          extend_lookahead();
        }
        work_cv.notify_all();
        continue;
      }
      if (std::none_of(slots.begin(), slots.end(), [](int64_t s) { return s >= 0; })) return std::nullopt;
      cycle_index = (cycle_index + 1) % C;
    }
  }

  std::optional<Record> next_shuffled() {
    for (;;) {
      if (filling) {
        while (static_cast<int64_t>(buffer.size()) < S) {
          auto r = next_interleaved();
          if (!r) break;
          buffer.push_back(std::move(*r));
        }
        filling = false;
      }
      if (buffer.empty()) {  // the epoch is over
        // Without this an epoch of empty records would be followed by the next one, forever.
        check(epoch_tokens > 0, "input pipeline: no tokens in {}{}: every record is empty or there are none",
              files.front().string(), n > 1 ? fmt::format(" and the {} other shard(s) read with it", n - 1) : "");
        if (opt.num_epochs > 0 && epoch + 1 >= opt.num_epochs) return std::nullopt;
        ++epoch;
        epoch_tokens = 0;
        filling = true;
        rng = Rng(mix(opt.seed, kShuffleTag, static_cast<uint64_t>(epoch)));
        cycle_index = 0;
        continue;
      }
      size_t j = static_cast<size_t>(rng.below(buffer.size()));
      Record out = std::move(buffer[j]);
      if (auto r = next_interleaved()) {
        buffer[j] = std::move(*r);
      } else {
        if (j + 1 != buffer.size()) buffer[j] = std::move(buffer.back());
        buffer.pop_back();
      }
      return out;
    }
  }

  bool fill_sample(int32_t* dst) {
    int64_t fill = 0;
    if (carry >= 0) dst[fill++] = static_cast<int32_t>(carry);
    while (fill < L) {
      if (!current || pos >= current->tokens.size()) {
        auto r = next_shuffled();
        if (!r) return false;
        current = std::move(*r);
        pos = 0;
        continue;
      }
      size_t take = std::min(static_cast<size_t>(L - fill), current->tokens.size() - pos);
      std::memcpy(dst + fill, current->tokens.data() + pos, take * sizeof(int32_t));
      fill += static_cast<int64_t>(take);
      pos += take;
    }
    carry = dst[L - 1];
    return true;
  }

  SeqState snapshot() const {
    SeqState s;
    s.next_batch = next_batch;
    s.epoch = epoch;
    s.slots = slots;
    s.slot_offsets = slot_offsets;
    s.cycle_index = cycle_index;
    s.next_g = next_g;
    s.filling = filling;
    s.rng = rng.state();
    s.buffer.reserve(buffer.size());
    for (const Record& r : buffer) s.buffer.push_back(Ref{r.file, r.offset});
    s.carry = carry;
    if (current) {
      s.has_record = true;
      s.record = Ref{current->file, current->offset};
      s.record_pos = static_cast<int64_t>(pos);
    }
    return s;
  }

  // Threads stopped: sets the sequencer to `s`, reading the records it references.
  void load(const SeqState& s) {
    next_batch = s.next_batch;
    epoch = s.epoch;
    slots = s.slots;
    slot_offsets = s.slot_offsets;
    cycle_index = s.cycle_index;
    next_g = s.next_g;
    filling = s.filling;
    rng.set_state(s.rng);
    buffer = read_refs(s.buffer);
    carry = s.carry;
    current.reset();
    pos = 0;
    if (s.has_record) {
      current = std::move(read_refs({s.record})[0]);
      check(s.record_pos >= 0 && static_cast<size_t>(s.record_pos) <= current->tokens.size(),
            "pipeline state: record position {} out of range", s.record_pos);
      pos = static_cast<size_t>(s.record_pos);
    }
    epoch_tokens = (s.next_batch > 0 || !buffer.empty()) ? 1 : 0;
    readers.clear();
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k] >= 0) ensure_reader(slots[k], slot_offsets[k]).in_cycle = true;
    }
    extend_lookahead();
  }

  void push(Batch b) {
    std::unique_lock lock(out_mu);
    room_cv.wait(lock, [&] { return stop || static_cast<int>(out.size()) < std::max(1, opt.prefetch); });
    if (stop) throw Stopped{};
    out.push_back(std::move(b));
    lock.unlock();
    out_cv.notify_all();
  }

  void sequencer_main() {
    try {
      for (;;) {
        Batch b;
        {
          std::lock_guard lock(out_mu);
          if (!free_buffers.empty()) {
            b.tokens = std::move(free_buffers.back());
            free_buffers.pop_back();
          }
        }
        b.tokens.resize(static_cast<size_t>(opt.global_batch * L));
        for (int64_t s = 0; s < opt.global_batch; ++s) {
          if (!fill_sample(b.tokens.data() + s * L)) {
            Batch end;
            end.end = true;
            push(std::move(end));
            return;
          }
        }
        ++next_batch;
        b.state = snapshot();
        push(std::move(b));
      }
    } catch (const Stopped&) {
    } catch (...) {
      {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
      }
      std::lock_guard lock(out_mu);
      out_cv.notify_all();
    }
  }

  // ------------------------------------------------------------------ lifecycle
  void start() {
    if (started) return;
    stop = false;
    error = nullptr;
    load(consumer_state);
    for (int i = 0; i < max_par; ++i) workers.emplace_back([this, i] { worker_main(i); });
    sequencer = std::thread([this] { sequencer_main(); });
    window_start = std::chrono::steady_clock::now();
    started = true;
  }

  void halt() {
    if (!started) return;
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    {
      std::lock_guard lock(out_mu);
      stop = true;  // (also read under out_mu by push)
    }
    work_cv.notify_all();
    data_cv.notify_all();
    room_cv.notify_all();
    out_cv.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
    if (sequencer.joinable()) sequencer.join();
    readers.clear();
    out.clear();
    started = false;
  }

  void rethrow_error() {
    std::exception_ptr e;
    {
      std::lock_guard lock(mu);
      e = error;
    }
    if (e) std::rethrow_exception(e);
  }

  const std::vector<int32_t>* next(int64_t index) {
    if (current_index >= 0 && index == current_index) return &batch;
    if (ended) return nullptr;
    check(index == consumer_state.next_batch,
          "input pipeline: asked for global batch {}, but the next one is {} (and the last returned {})", index,
          consumer_state.next_batch, current_index);
    start();
    auto t0 = std::chrono::steady_clock::now();
    Batch b;
    {
      std::unique_lock lock(out_mu);
      out_cv.wait(lock, [&] {
        if (!out.empty()) return true;
        std::lock_guard l2(mu);
        return static_cast<bool>(error);
      });
      if (out.empty()) {
        lock.unlock();
        rethrow_error();
      }
      b = std::move(out.front());
      out.pop_front();
    }
    room_cv.notify_all();
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wait_seconds += waited;
    if (b.end) {
      ended = true;
      return nullptr;
    }
    {
      std::lock_guard lock(out_mu);
      if (!batch.empty()) free_buffers.push_back(std::move(batch));
    }
    batch = std::move(b.tokens);
    consumer_state = std::move(b.state);
    current_index = index;
    ++batches;
    // Autotune: more parallelism while the consumer waits for more than 2% of its time.
    window_wait += waited;
    if (++window_batches >= std::max<int64_t>(1, opt.autotune_window)) {
      auto now = std::chrono::steady_clock::now();
      double elapsed = std::chrono::duration<double>(now - window_start).count();
      if (autotune && window_wait > 0.02 * elapsed && parallelism.load() < max_par) {
        {
          std::lock_guard lock(mu);
          parallelism.fetch_add(1);
        }
        work_cv.notify_all();
      }
      window_wait = 0;
      window_batches = 0;
      window_start = now;
    }
    return &batch;
  }
};

InputPipeline::InputPipeline(std::vector<fs::path> shards, PipelineOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  check(options.global_batch > 0, "input pipeline: global_batch must be positive (got {})", options.global_batch);
  check(options.sequence_length > 0, "input pipeline: sequence_length must be positive (got {})",
        options.sequence_length);
  check(options.cycle_length > 0, "input pipeline: cycle_length must be positive");
  check(options.num_parallel_calls == -1 || options.num_parallel_calls > 0,
        "input pipeline: num_parallel_calls must be positive or -1 (autotune)");
  check(options.num_epochs == -1 || options.num_epochs > 0, "input pipeline: num_epochs must be positive or -1");
  check(!shards.empty(), "input pipeline: no shards");
  for (size_t i : auto_shard_files(shards.size(), options.num_workers, options.worker_index)) m.files.push_back(shards[i]);
  check(!m.files.empty(), "input pipeline: worker {} of {} gets none of the {} shards (use fewer workers)",
        options.worker_index, options.num_workers, shards.size());
  for (const auto& f : m.files) {
    check(fs::exists(f), "input pipeline: {} does not exist", f.string());
    m.compressions.push_back(compression_of(f, options.compression));
  }
  m.opt = std::move(options);
  m.n = static_cast<int64_t>(m.files.size());
  m.L = m.opt.sequence_length + 1;
  m.C = m.opt.cycle_length;
  m.S = std::max<int64_t>(1, m.opt.shuffle_buffer);
  m.g_max = m.opt.num_epochs > 0 ? m.opt.num_epochs * m.n : std::numeric_limits<int64_t>::max() / 2;
  int cores = m.opt.max_parallelism > 0 ? m.opt.max_parallelism
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m.autotune = m.opt.num_parallel_calls == -1;
  m.max_par = m.autotune ? std::max(1, std::min(m.C, cores)) : std::min(m.opt.num_parallel_calls, m.C);
  m.parallelism = m.autotune ? 1 : m.max_par;

  // The order's identity: shard names and sizes + the options the order depends on.
  std::string id = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", m.opt.seed, m.opt.global_batch, m.opt.sequence_length,
                               m.S, m.C, m.opt.shuffle_files, m.opt.num_epochs, m.opt.num_workers,
                               m.opt.worker_index, m.opt.feature);
  for (const auto& f : m.files) id += fmt::format("|{}:{}", f.filename().string(), fs::file_size(f));
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
  m.fingerprint = hex64(h);
  m.consumer_state = m.initial_state();
}

InputPipeline::~InputPipeline() { impl_->halt(); }

const std::vector<int32_t>* InputPipeline::try_global_batch(int64_t index) { return impl_->next(index); }

const std::vector<int32_t>& InputPipeline::global_batch(int64_t index) {
  const std::vector<int32_t>* b = impl_->next(index);
  check(b != nullptr, "input pipeline: end of data before global batch {} ({} epoch(s) of {} shard(s))", index,
        impl_->opt.num_epochs, impl_->n);
  return *b;
}

std::span<const int32_t> InputPipeline::rank_slice(const std::vector<int32_t>& batch, int rank, int num_ranks) const {
  const int64_t B = impl_->opt.global_batch;
  check(num_ranks > 0 && rank >= 0 && rank < num_ranks && B % num_ranks == 0,
        "input pipeline: rank {} of {} cannot slice a global batch of {}", rank, num_ranks, B);
  const size_t rows = static_cast<size_t>(B / num_ranks), L = static_cast<size_t>(impl_->L);
  return std::span<const int32_t>(batch).subspan(static_cast<size_t>(rank) * rows * L, rows * L);
}

int64_t InputPipeline::next_index() const { return impl_->consumer_state.next_batch; }

json InputPipeline::state() const { return state_to_json(impl_->consumer_state, impl_->fingerprint); }

void InputPipeline::restore(const json& state) {
  Impl& m = *impl_;
  SeqState s = state_from_json(state, m.fingerprint, m.C, m.n);
  m.halt();
  m.consumer_state = std::move(s);
  m.current_index = -1;
  m.batch.clear();
  m.ended = false;
}

int32_t InputPipeline::max_token() const {
  Impl& m = *impl_;
  std::lock_guard lock(m.max_mu);
  if (m.max_token_cache) return *m.max_token_cache;
  // The manifest of `data prepare`, when it lists every shard.
  fs::path manifest_path = m.files.front().parent_path() / "manifest.json";
  if (fs::exists(manifest_path)) {
    json manifest = json::parse(read_file(manifest_path), nullptr, false);
    std::map<std::string, int64_t> listed;  // shard file -> its split's max token
    try {
      if (!manifest.is_discarded() && manifest.contains("splits")) {
        for (const auto& [name, split] : manifest["splits"].items()) {
          for (const json& shard : split.value("shards", json::array())) {
            listed[shard.value("file", "")] = split.value("max_token", int64_t{-1});
          }
        }
      }
    } catch (const json::exception&) {  // a manifest of another shape lists nothing: the shards are read
      listed.clear();
    }
    int64_t best = -1;
    bool all = true;
    for (const auto& f : m.files) {
      auto it = listed.find(f.filename().string());
      if (it == listed.end() || f.parent_path() != manifest_path.parent_path()) {
        all = false;
        break;
      }
      best = std::max(best, it->second);
    }
    if (all) return *(m.max_token_cache = static_cast<int32_t>(best));
  }
  int32_t best = -1;
  std::vector<int64_t> scratch;
  std::vector<int32_t> tokens;
  for (uint32_t f = 0; f < m.files.size(); ++f) {
    auto reader = m.open(f);
    while (auto bytes = reader->next()) {
      m.parse(*bytes, f, reader->record_offset(), scratch, tokens);
      for (int32_t t : tokens) best = std::max(best, t);
    }
  }
  return *(m.max_token_cache = best);
}

int64_t InputPipeline::epoch() const { return impl_->consumer_state.epoch; }

PipelineStats InputPipeline::stats() const {
  const Impl& m = *impl_;
  PipelineStats s;
  s.batches = m.batches;
  s.records = m.records_parsed.load();
  s.tokens = m.tokens_parsed.load();
  s.wait_seconds = m.wait_seconds;
  s.parallelism = m.parallelism.load();
  return s;
}

const std::vector<fs::path>& InputPipeline::files() const { return impl_->files; }

}  // namespace paraflow::data
