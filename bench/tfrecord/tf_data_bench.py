"""tf.data side of bench/tfrecord/tfrecord_bench.cc: read + parse the same shards, in-graph.

    python tf_data_bench.py --compression NONE --repeats 3 FILE...

Prints one JSON object: {variant: {"records": n, "tokens": n, "seconds": best of repeats}} for
  "parse_single": TFRecordDataset -> map(parse_single_example) (one record at a time)
  "parse_batched": TFRecordDataset -> batch(256) -> map(parse_example, AUTOTUNE) (TF's fast idiom)
Both count tokens with Dataset.reduce, so no Python runs per record.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compression", default="NONE")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    compression = "" if args.compression == "NONE" else args.compression
    spec = {"input_ids": tf.io.VarLenFeature(tf.int64)}

    def single():
        ds = tf.data.TFRecordDataset(args.files, compression_type=compression)
        return ds.map(lambda r: tf.io.parse_single_example(r, spec)["input_ids"].values)

    def batched():
        ds = tf.data.TFRecordDataset(args.files, compression_type=compression).batch(256)
        return ds.map(lambda r: tf.io.parse_example(r, spec)["input_ids"].values,
                      num_parallel_calls=tf.data.AUTOTUNE)

    out = {}
    for name, make in (("parse_single", single), ("parse_batched", batched)):
        ds = make()
        records = tf.data.TFRecordDataset(args.files, compression_type=compression).reduce(
            tf.constant(0, tf.int64), lambda n, _: n + 1)
        best = None
        for _ in range(args.repeats):
            start = time.perf_counter()
            tokens = ds.reduce(tf.constant(0, tf.int64), lambda n, v: n + tf.size(v, out_type=tf.int64))
            tokens = int(tokens.numpy())
            elapsed = time.perf_counter() - start
            best = elapsed if best is None else min(best, elapsed)
        out[name] = {"records": int(records.numpy()), "tokens": tokens, "seconds": best}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
