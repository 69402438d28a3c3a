"""TensorFlow/Keras peer of paraflow's train_bench: GPT-2 written with Keras layers (token and
position embeddings, pre-LN blocks with keras.layers.MultiHeadAttention under a causal mask
(separate q/k/v projections: the same parameter count as GPT-2's fused c_attn), tanh-GELU MLP,
final LayerNorm, lm_head tied to the token embedding) or, with --arch llama, a Llama (RMSNorm,
rotary positions, grouped-query attention with k/v heads repeated per group under a causal mask,
SwiGLU MLP, untied lm_head; no biases), trained by a custom tf.function step
(not model.fit): AdamW(6e-4, betas 0.9/0.95, wd 0.1), global-norm gradient clipping at 1.0,
random tokens. float32 or the mixed_bfloat16 Keras policy, with or without XLA (--xla:
jit_compile=True). Run by compare_peers.py, one mode per process (the policy is global); alone:

    .venv-data/bin/python bench/train/peer_tf.py --threads 2 [--precision mixed_bfloat16] [--xla] [--steps 10]
"""
import functools
import os

import peer_common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


class TiedEmbedding(keras.layers.Embedding):
    """Token embedding whose transpose is also the lm_head (reverse=True)."""

    def call(self, inputs, reverse=False):
        if reverse:
            return tf.matmul(inputs, tf.cast(self.embeddings, self.compute_dtype), transpose_b=True)
        return super().call(inputs)


class Block(keras.layers.Layer):
    def __init__(self, n_embd, n_head, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.ln_1 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.attn = keras.layers.MultiHeadAttention(n_head, n_embd // n_head, kernel_initializer=init)
        self.ln_2 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.fc = keras.layers.Dense(4 * n_embd, kernel_initializer=init,
                                     activation=functools.partial(keras.activations.gelu, approximate=True))
        self.proj = keras.layers.Dense(n_embd, kernel_initializer=init)

    def call(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, use_causal_mask=True)
        return x + self.proj(self.fc(self.ln_2(x)))


class RmsNorm(keras.layers.Layer):
    """x / sqrt(mean(x²) + eps) · weight, the mean taken in float32 (as transformers' LlamaRMSNorm)."""

    def build(self, shape):
        self.weight = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        x32 = tf.cast(x, tf.float32)
        normed = x32 * tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + 1e-6)
        return tf.cast(normed, self.compute_dtype) * tf.cast(self.weight, self.compute_dtype)


def rotate(x, cos, sin):
    """Rotary embeddings in the rotate_half form on x (B, T, heads, head_dim)."""
    first, second = tf.split(x, 2, axis=-1)
    return x * cos + tf.concat([-second, first], axis=-1) * sin


class LlamaBlock(keras.layers.Layer):
    def __init__(self, args, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.heads, self.head_dim = args.n_head, args.n_embd // args.n_head
        self.kv_heads, intermediate = peer_common.llama_sizes(args)

        def dense(width):
            return keras.layers.Dense(width, use_bias=False, kernel_initializer=init)

        self.norm_1, self.norm_2 = RmsNorm(), RmsNorm()
        self.q, self.k, self.v = dense(self.heads * self.head_dim), dense(self.kv_heads * self.head_dim), \
            dense(self.kv_heads * self.head_dim)
        self.o = dense(args.n_embd)
        self.gate, self.up, self.down = dense(intermediate), dense(intermediate), dense(args.n_embd)

    def call(self, x, cos, sin):
        batch, length = tf.shape(x)[0], tf.shape(x)[1]

        def heads(y, count):
            return tf.reshape(y, (batch, length, count, self.head_dim))

        h = self.norm_1(x)
        q = rotate(heads(self.q(h), self.heads), cos, sin)
        k = rotate(heads(self.k(h), self.kv_heads), cos, sin)
        v = heads(self.v(h), self.kv_heads)
        group = self.heads // self.kv_heads
        k, v = tf.repeat(k, group, axis=2), tf.repeat(v, group, axis=2)
        scores = tf.einsum("bthd,bshd->bhts", q, k) / tf.cast(self.head_dim ** 0.5, q.dtype)
        causal = tf.linalg.band_part(tf.ones((length, length), tf.bool), -1, 0)
        scores = tf.where(causal, tf.cast(scores, tf.float32), -1e9)
        probabilities = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
        attention = tf.reshape(tf.einsum("bhts,bshd->bthd", probabilities, v), (batch, length, -1))
        x = x + self.o(attention)
        h = self.norm_2(x)
        return x + self.down(tf.nn.silu(self.gate(h)) * self.up(h))


class Llama(keras.Model):
    def __init__(self, args, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.embed = keras.layers.Embedding(args.vocab, args.n_embd, embeddings_initializer=init)
        self.blocks = [LlamaBlock(args) for _ in range(args.n_layer)]
        self.norm = RmsNorm()
        self.lm_head = keras.layers.Dense(args.vocab, use_bias=False, kernel_initializer=init)
        head_dim = args.n_embd // args.n_head
        self.inverse_frequencies = 1.0 / (10000.0 ** (tf.range(0, head_dim, 2, dtype=tf.float32) / head_dim))

    def call(self, tokens):
        x = self.embed(tokens)
        angles = tf.cast(tf.range(tf.shape(tokens)[1]), tf.float32)[:, None] * self.inverse_frequencies[None, :]
        angles = tf.concat([angles, angles], axis=-1)[None, :, None, :]  # (1, T, 1, head_dim)
        cos, sin = tf.cast(tf.cos(angles), x.dtype), tf.cast(tf.sin(angles), x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


class Gpt(keras.Model):
    def __init__(self, args, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.wte = TiedEmbedding(args.vocab, args.n_embd, embeddings_initializer=init)
        self.wpe = keras.layers.Embedding(args.n_ctx, args.n_embd, embeddings_initializer=init)
        self.blocks = [Block(args.n_embd, args.n_head) for _ in range(args.n_layer)]
        self.ln_f = keras.layers.LayerNormalization(epsilon=1e-5)

    def call(self, tokens):
        x = self.wte(tokens) + self.wpe(tf.range(tf.shape(tokens)[1]))
        for block in self.blocks:
            x = block(x)
        return self.wte(self.ln_f(x), reverse=True)


def main():
    arguments = peer_common.parser(__doc__)
    arguments.add_argument("--xla", action="store_true", help="jit_compile=True")
    args = arguments.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    model = Llama(args) if args.arch == "llama" else Gpt(args)
    model(tf.zeros((1, 1), tf.int32))  # creates the variables outside the compiled step
    optimizer = keras.optimizers.AdamW(learning_rate=6e-4, beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1)
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=args.xla)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        gradients, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 1.0)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def step():
        x = tf.random.uniform((args.batch, args.n_ctx), maxval=args.vocab, dtype=tf.int32)
        y = tf.random.uniform((args.batch, args.n_ctx), maxval=args.vocab, dtype=tf.int32)
        float(train_step(x, y))  # waits for the step

    parameters = sum(int(tf.size(v)) for v in model.trainable_variables)
    peer_common.measure(step, args, f"{tf.__version__} (Keras {keras.__version__})", parameters)


if __name__ == "__main__":
    main()
