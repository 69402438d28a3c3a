#include "ps/task_memory.h"

#include <algorithm>
#include <map>

#include "ps/placement.h"
#include "ps/wire.h"

namespace paraflow::ps {

namespace {

constexpr int64_t kFloat = sizeof(float);

// A buffer of at least 2 MiB is allocated whole 2 MiB pages (tensor.cc's allocate_host, for huge
// pages) and zeroed: all of it resident.
int64_t host_buffer_bytes(int64_t bytes) {
  constexpr int64_t kHugePage = int64_t{2} << 20;
  return bytes >= kHugePage ? (bytes + kHugePage - 1) / kHugePage * kHugePage : bytes;
}

// What a tensor allocated whole costs once `written` of its bytes are written: allocate_host
// zero-fills a buffer under 64 MiB (all of it resident) and maps a larger one anew, zero until
// written (only the written pages resident).
int64_t host_tensor_bytes(int64_t bytes, int64_t written) {
  constexpr int64_t kMappedAnew = int64_t{64} << 20;
  return host_buffer_bytes(bytes < kMappedAnew ? bytes : written);
}

// A message of a chunk in flight: as protobuf's string and as gRPC's buffer.
int64_t message_bytes(int64_t array_bytes) { return 2 * std::min(kChunkBytes, array_bytes); }

// The tensor a piece belongs to: "wte.weight[0:2048]" is a block of wte.weight's rows.
std::string tensor_of(const Piece& piece) { return piece.tensor.substr(0, piece.tensor.find('[')); }

void add_task(std::vector<train::RankPeaks>& entries, const std::string& role, int index, const train::RunPeaks& peaks) {
  for (train::RankPeaks& entry : entries) {
    if (entry.role == role && entry.peaks == peaks) {
      entry.ranks.push_back(index);
      return;
    }
  }
  entries.push_back({role, {index}, peaks});
}

}  // namespace

std::vector<train::RankPeaks> predict_task_peaks(const model::GptConfig& model, const train::TrainConfig& config,
                                                 int ps_tasks, int workers, bool synchronous, int threads) {
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(model, config.decay_embeddings);
  const Placement placement = place_variables(specs, ps_tasks);
  std::vector<train::RankPeaks> entries;

  // The chief holds one array of a piece at a time (its values or a moment):
  // - start-up: it initialises each piece from its whole tensor (allocated, the piece's rows
  //   written, the piece copied out) and fills it in, a chunk a message; a resumed run reads the
  //   piece from the checkpoint instead (its mapped pages and the copy: no more);
  // - checkpoint: it snapshots each piece into the checkpoint, a chunk a message;
  // - export: it assembles each whole tensor from the checkpoint's slices, the mapped pages of
  //   the piece being copied into it resident meanwhile.
  // From its first snapshot on, gRPC keeps a read buffer of about a reply on its channel to
  // each ps task (heaptrack: 1.2-1.3 MiB a ps task after 1 MiB replies, through the export).
  int64_t largest_piece = 0, read_buffers = 0;
  std::map<std::string, int64_t> largest_piece_of;
  for (const std::vector<Piece>& shard : placement.shards) {
    int64_t largest_here = 0;
    for (const Piece& piece : shard) {
      largest_here = std::max(largest_here, piece.count);
      largest_piece_of[tensor_of(piece)] = std::max(largest_piece_of[tensor_of(piece)], piece.count);
    }
    largest_piece = std::max(largest_piece, largest_here);
    read_buffers += std::min(kChunkBytes, largest_here * kFloat);
  }
  const int64_t piece_bytes = largest_piece * kFloat;
  int64_t initialise_bytes = piece_bytes + message_bytes(piece_bytes), export_bytes = 0;
  for (const model::TensorSpec& spec : specs) {
    const int64_t tensor = spec.shape.numel() * kFloat, piece = largest_piece_of[spec.name] * kFloat;
    initialise_bytes = std::max(initialise_bytes, host_tensor_bytes(tensor, piece) + piece);
    export_bytes = std::max(export_bytes, tensor + piece);
  }
  train::RunPeaks chief;
  chief.start_up = initialise_bytes;
  chief.checkpoint = piece_bytes + message_bytes(piece_bytes) + read_buffers;
  chief.export_model = export_bytes + read_buffers;
  add_task(entries, "chief", 0, chief);

  // A worker is one process training on its slice of the batch (synchronous: batch_size / W; the
  // whole batch asynchronously), without optimizer state, and with its messages: per ps task a
  // pull (gRPC's buffer and the parsed string) and a push (the gathered string and gRPC's copy),
  // a chunk each.
  train::TrainConfig slice = config;
  slice.batch_size = synchronous ? config.batch_size / workers : config.batch_size;
  slice.grad_accumulation = 1;
  slice.sync.zero = 0;
  const train::MemoryReport replica = train::estimate_training_memory(model, slice, 1, threads);
  int64_t worker_messages = 0;
  for (size_t task = 0; task < placement.shards.size(); ++task) {
    const int64_t shard = placement.shard_elements(task) * kFloat;
    worker_messages += 2 * message_bytes(shard);
  }
  train::RunPeaks worker;
  worker.start_up = host_buffer_bytes(replica.parameters) + host_buffer_bytes(replica.gradients);
  worker.step = worker.start_up + replica.step_allocations() + worker_messages;
  for (int index = 0; index < workers; ++index) add_task(entries, "worker", index, worker);

  // A ps task: its shard's values, gradients and both moments; synchronously, each slice's
  // gradients but the first kept apart until the sum (W slices a step), asynchronously per worker
  // a push being gathered from its chunks (when the shard spans more than one); and the calls in
  // flight, a chunk each way per worker and one being sent; a chunk of a Fill at start-up and of a
  // Snapshot at a checkpoint.
  for (int task = 0; task < ps_tasks; ++task) {
    const int64_t shard = placement.shard_elements(static_cast<size_t>(task)) * kFloat;
    const int64_t state = 4 * host_buffer_bytes(shard);
    const int64_t gathered = synchronous ? (workers - 1) * shard : shard > kChunkBytes ? workers * shard : 0;
    const int64_t messages = (2 * workers + 1) * std::min(kChunkBytes, shard);
    train::RunPeaks ps;
    ps.start_up = state + message_bytes(shard);
    ps.step = state + gathered + messages;
    ps.checkpoint = state + gathered + message_bytes(shard);
    add_task(entries, "ps", task, ps);
  }
  return entries;
}

}  // namespace paraflow::ps
