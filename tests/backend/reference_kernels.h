// Slow, obvious float64 references for every op kernel; the fast kernels are tested against
// them, and they are themselves checked against central finite differences. Shapes and the
// accumulate-into-gradients convention follow backend/backend.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace paraflow::reference {

using Vec = std::vector<double>;

inline void embedding_forward(Vec& out, const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int64_t B,
                              int64_t T, int64_t C) {
  out.assign(B * T * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
}

inline void embedding_backward(Vec& dwte, Vec& dwpe, const Vec& dout, const std::vector<int32_t>& tokens, int64_t B,
                               int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        dwte[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        dwpe[t * C + c] += dout[(b * T + t) * C + c];
      }
}

inline void layernorm_forward(Vec& out, const Vec& inp, const Vec& w, const Vec& bias, int64_t N, int64_t C,
                              double eps) {
  out.assign(N * C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += inp[n * C + c];
    mean /= C;
    for (int64_t c = 0; c < C; ++c) var += (inp[n * C + c] - mean) * (inp[n * C + c] - mean);
    var /= C;
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (inp[n * C + c] - mean) * rstd * w[c] + bias[c];
  }
}

inline void layernorm_backward(Vec& dinp, Vec& dw, Vec& dbias, const Vec& dout, const Vec& inp, const Vec& w,
                               int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += inp[n * C + c];
    mean /= C;
    for (int64_t c = 0; c < C; ++c) var += (inp[n * C + c] - mean) * (inp[n * C + c] - mean);
    var /= C;
    double rstd = 1.0 / std::sqrt(var + eps);
    double mean_dnorm = 0, mean_dnorm_norm = 0;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (inp[n * C + c] - mean) * rstd;
      double dnorm = w[c] * dout[n * C + c];
      mean_dnorm += dnorm / C;
      mean_dnorm_norm += dnorm * norm / C;
      dbias[c] += dout[n * C + c];
      dw[c] += norm * dout[n * C + c];
    }
    for (int64_t c = 0; c < C; ++c) {
      double norm = (inp[n * C + c] - mean) * rstd;
      dinp[n * C + c] += rstd * (w[c] * dout[n * C + c] - mean_dnorm - norm * mean_dnorm_norm);
    }
  }
}

inline double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
inline double gelu_grad(double x) {
  double k = std::sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// W is [C,OC] (transposed=false) or [OC,C] (transposed=true).
inline double weight_at(const Vec& W, int64_t c, int64_t o, int64_t C, int64_t OC, bool transposed) {
  return transposed ? W[o * C + c] : W[c * OC + o];
}

inline void matmul_forward(Vec& out, const Vec& inp, const Vec& W, const Vec* bias, int64_t N, int64_t C, int64_t OC,
                           bool transposed, bool gelu_after) {
  out.assign(N * OC, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double sum = bias ? (*bias)[o] : 0.0;
      for (int64_t c = 0; c < C; ++c) sum += inp[n * C + c] * weight_at(W, c, o, C, OC, transposed);
      out[n * OC + o] = gelu_after ? gelu(sum) : sum;
    }
}

inline void matmul_backward(Vec& dinp, Vec& dW, Vec* dbias, const Vec& dout, const Vec& inp, const Vec& W,
                            const Vec* bias, int64_t N, int64_t C, int64_t OC, bool transposed, bool gelu_after) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double d = dout[n * OC + o];
      if (gelu_after) {
        double pre = bias ? (*bias)[o] : 0.0;
        for (int64_t c = 0; c < C; ++c) pre += inp[n * C + c] * weight_at(W, c, o, C, OC, transposed);
        d *= gelu_grad(pre);
      }
      if (dbias) (*dbias)[o] += d;
      for (int64_t c = 0; c < C; ++c) {
        dinp[n * C + c] += d * weight_at(W, c, o, C, OC, transposed);
        (transposed ? dW[o * C + c] : dW[c * OC + o]) += d * inp[n * C + c];
      }
    }
}

// Scores are scale * q·k^T (GPT-2: scale = 1/sqrt(C/NH)). C = NH·hs is the output's width; qkv
// holds q's NH heads, then k's and v's KVH heads (0: NH) each, q head h reading k/v head
// h / (NH/KVH).
struct QkvLayout {
  int64_t C, NH, KVH, hs, W;
  QkvLayout(int64_t C, int64_t NH, int64_t KVH)
      : C(C), NH(NH), KVH(KVH > 0 ? KVH : NH), hs(C / NH), W(C + 2 * (KVH > 0 ? KVH : NH) * (C / NH)) {}
  int64_t q(int64_t h) const { return h * hs; }
  int64_t k(int64_t h) const { return C + h / (NH / KVH) * hs; }
  int64_t v(int64_t h) const { return C + KVH * hs + h / (NH / KVH) * hs; }
};

inline void attention_forward(Vec& out, const Vec& qkv, int64_t B, int64_t T, int64_t C, int64_t NH, double scale,
                              int64_t KVH = 0) {
  const QkvLayout l(C, NH, KVH);
  const int64_t hs = l.hs, W = l.W;
  out.assign(B * T * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double max_value = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hs; ++i) s += qkv[(b * T + t) * W + l.q(h) + i] * qkv[(b * T + j) * W + l.k(h) + i];
          p[j] = s * scale;
          max_value = std::max(max_value, p[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - max_value));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < hs; ++i)
            out[(b * T + t) * C + h * hs + i] += p[j] / sum * qkv[(b * T + j) * W + l.v(h) + i];
      }
}

inline void attention_backward(Vec& dqkv, const Vec& dout, const Vec& qkv, int64_t B, int64_t T, int64_t C,
                               int64_t NH, double scale, int64_t KVH = 0) {
  const QkvLayout l(C, NH, KVH);
  const int64_t hs = l.hs, W = l.W;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        auto q = [&](int64_t i) { return qkv[(b * T + t) * W + l.q(h) + i]; };
        auto k = [&](int64_t j, int64_t i) { return qkv[(b * T + j) * W + l.k(h) + i]; };
        auto v = [&](int64_t j, int64_t i) { return qkv[(b * T + j) * W + l.v(h) + i]; };
        std::vector<double> p(t + 1), dp(t + 1);
        double max_value = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hs; ++i) s += q(i) * k(j, i);
          p[j] = s * scale;
          max_value = std::max(max_value, p[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - max_value));
        for (int64_t j = 0; j <= t; ++j) p[j] /= sum;
        double dot = 0;
        for (int64_t j = 0; j <= t; ++j) {
          dp[j] = 0;
          for (int64_t i = 0; i < hs; ++i) {
            double dy = dout[(b * T + t) * C + h * hs + i];
            dp[j] += dy * v(j, i);
            dqkv[(b * T + j) * W + l.v(h) + i] += p[j] * dy;
          }
          dot += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= t; ++j) {
          double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t i = 0; i < hs; ++i) {
            dqkv[(b * T + t) * W + l.q(h) + i] += ds * k(j, i);
            dqkv[(b * T + j) * W + l.k(h) + i] += ds * q(i);
          }
        }
      }
}

inline void rmsnorm_forward(Vec& out, const Vec& inp, const Vec& w, int64_t N, int64_t C, double eps) {
  out.assign(N * C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double mean_sq = 0;
    for (int64_t c = 0; c < C; ++c) mean_sq += inp[n * C + c] * inp[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = inp[n * C + c] / std::sqrt(mean_sq + eps) * w[c];
  }
}

// Differentiates y_c = x_c·r·w_c with r = (mean(x²) + eps)^-1/2, dr/dx_c = -r³·x_c/C.
inline void rmsnorm_backward(Vec& dinp, Vec& dw, const Vec& dout, const Vec& inp, const Vec& w, int64_t N, int64_t C,
                             double eps) {
  for (int64_t n = 0; n < N; ++n) {
    double mean_sq = 0;
    for (int64_t c = 0; c < C; ++c) mean_sq += inp[n * C + c] * inp[n * C + c] / C;
    const double r = 1 / std::sqrt(mean_sq + eps);
    double dr = 0;  // dL/dr
    for (int64_t c = 0; c < C; ++c) {
      dr += dout[n * C + c] * inp[n * C + c] * w[c];
      dw[c] += dout[n * C + c] * inp[n * C + c] * r;
    }
    for (int64_t c = 0; c < C; ++c)
      dinp[n * C + c] += dout[n * C + c] * r * w[c] - dr * r * r * r * inp[n * C + c] / C;
  }
}

// Rotary embeddings on the q and k heads of rows of W = (NH + 2·KVH)·hs, row r at position
// positions[r]: element i < hs/2 of a head and element i + hs/2 rotated by positions[r]·inv[i].
inline void rope_forward(Vec& out, const Vec& qkv, const std::vector<int64_t>& positions, const Vec& inv, int64_t NH,
                         int64_t KVH, int64_t hs) {
  const int64_t W = (NH + 2 * KVH) * hs, half = hs / 2;
  out = qkv;
  for (size_t r = 0; r < positions.size(); ++r)
    for (int64_t head = 0; head < NH + KVH; ++head)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[r]) * inv[i];
        const double x1 = qkv[r * W + head * hs + i], x2 = qkv[r * W + head * hs + half + i];
        out[r * W + head * hs + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
        out[r * W + head * hs + half + i] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
}

inline double silu(double x) { return x / (1 + std::exp(-x)); }

inline void swiglu_forward(Vec& out, const Vec& gate, const Vec& up) {
  out.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) out[i] = silu(gate[i]) * up[i];
}

inline void swiglu_backward(Vec& dgate, Vec& dup, const Vec& dout, const Vec& gate, const Vec& up) {
  for (size_t i = 0; i < gate.size(); ++i) {
    const double s = 1 / (1 + std::exp(-gate[i]));
    dgate[i] += dout[i] * up[i] * (s + gate[i] * s * (1 - s));
    dup[i] += dout[i] * silu(gate[i]);
  }
}

inline void softmax_xent_forward(Vec& losses, const Vec& logits, const std::vector<int32_t>& targets, int64_t N,
                                 int64_t V) {
  losses.assign(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double max_value = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; ++i) max_value = std::max(max_value, logits[n * V + i]);
    for (int64_t i = 0; i < V; ++i) sum += std::exp(logits[n * V + i] - max_value);
    losses[n] = targets[n] < 0 ? 0.0 : std::log(sum) + max_value - logits[n * V + targets[n]];
  }
}

inline void softmax_xent_backward(Vec& dlogits, const Vec& logits, const std::vector<int32_t>& targets,
                                  const Vec& dlosses, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    double max_value = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; ++i) max_value = std::max(max_value, logits[n * V + i]);
    for (int64_t i = 0; i < V; ++i) sum += std::exp(logits[n * V + i] - max_value);
    for (int64_t i = 0; i < V; ++i)
      dlogits[n * V + i] += (std::exp(logits[n * V + i] - max_value) / sum - (i == targets[n])) * dlosses[n];
  }
}

}  // namespace paraflow::reference
