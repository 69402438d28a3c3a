"""TensorFlow oracle for `paraflow data prepare` shards (tests/data/prepare_test.cc).

    python tf_pipeline.py --compression {NONE,GZIP,ZLIB} FILE...

tf.data.TFRecordDataset reads each FILE and tf.io.parse_single_example parses every record with
input_ids as a VarLenFeature(tf.int64). Prints one JSON object to stdout:
    {basename: {"records": n, "tokens": n, "max_token": m, "checksum": c}}
checksum = (sum over records j, tokens i of ids[i] * (i + 1) * (j + 1)) mod 2**64: order-sensitive,
computed exactly with Python integers. Exit status 0 on success, 1 on any error (reason on stderr).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compression", default="NONE")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    compression = "" if args.compression == "NONE" else args.compression
    spec = {"input_ids": tf.io.VarLenFeature(tf.int64)}
    out = {}
    for path in args.files:
        ds = tf.data.TFRecordDataset([path], compression_type=compression)
        ds = ds.map(lambda r: tf.sparse.to_dense(tf.io.parse_single_example(r, spec)["input_ids"]))
        records = tokens = checksum = 0
        max_token = -1
        for j, ids in enumerate(ds.as_numpy_iterator()):
            records += 1
            tokens += len(ids)
            values = [int(v) for v in ids]
            if values:
                max_token = max(max_token, max(values))
            checksum += sum(v * (i + 1) for i, v in enumerate(values)) * (j + 1)
        out[os.path.basename(path)] = {"records": records, "tokens": tokens, "max_token": max_token,
                                       "checksum": str(checksum % (1 << 64))}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        print(f"tf_pipeline.py: {e}", file=sys.stderr)
        sys.exit(1)
