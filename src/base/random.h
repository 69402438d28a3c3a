// A small, fully specified random generator (xoshiro256**, seeded by splitmix64), so results are
// identical across standard libraries and its whole state fits in a checkpoint.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace paraflow {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  void reseed(uint64_t seed) {
    for (auto& word : state_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      word = z ^ (z >> 31);
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, bound).
  uint64_t below(uint64_t bound) { return static_cast<uint64_t>(uniform() * static_cast<double>(bound)); }

  // Standard normal by Box-Muller (one value per call; simple beats fast here).
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  std::array<uint64_t, 4> state() const { return state_; }
  void set_state(const std::array<uint64_t, 4>& state) { state_ = state; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> state_{};
};

// Counter-based draws (the idea of Philox, which JAX and PyTorch's CUDA generator use): the value
// at `index` of the stream `key` is a pure function of the two, so any slice of a tensor can be
// drawn alone, by any process, equal bit for bit to the same elements drawn whole.
inline uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The stream of the tensor named `name` in a run seeded with `seed` (FNV-1a of the name, mixed).
inline uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (char c : name) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  return mix64(mix64(seed) ^ hash);
}

// Uniform in [0, 1) with 53 random bits, the `index`-th of stream `key`.
inline double uniform_at(uint64_t key, uint64_t index) {
  return static_cast<double>(mix64(key + (index + 1) * 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53;
}

// Standard normal by Box-Muller from draws 2·index and 2·index + 1 of stream `key`.
inline double normal_at(uint64_t key, uint64_t index) {
  double u1 = uniform_at(key, 2 * index);
  const double u2 = uniform_at(key, 2 * index + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace paraflow
