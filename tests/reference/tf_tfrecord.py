"""TensorFlow oracle for paraflow's TFRecord + tf.train.Example code (tests/data/tf_interop_test.cc).

    python tf_tfrecord.py write --compression {NONE,GZIP,ZLIB} --out FILE --expect JSON
        TensorFlow writes a fixed set of tf.train.Example records (empty features, float and
        bytes lists, empty lists, int64 extremes, records over 1 MB) with tf.io.TFRecordWriter;
        JSON gets what each record holds (the format below).
    python tf_tfrecord.py read --compression {NONE,GZIP,ZLIB} FILE
        tf.data.TFRecordDataset reads FILE and tf.io.parse_single_example parses every record
        (a VarLenFeature per key, typed as the record's proto says); prints the JSON to stdout.

JSON: a list with one object per record: {key: {"kind": "int64"|"float"|"bytes", "values": [...]}}
with int64 as numbers, floats as the exact double of the float32, bytes as lowercase hex.
Exit status 0 on success, 1 on any error (reason on stderr).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def options(compression):
    name = "" if compression == "NONE" else compression
    return name


def feature(kind, values):
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def oracle_records():
    rng = np.random.RandomState(1234)
    big_bytes = rng.randint(0, 256, size=1_500_000, dtype=np.uint8).tobytes()
    records = [
        {"input_ids": ("int64", list(range(10)))},
        {},  # an Example with no features at all
        {"x": ("float", [0.1, -2.5, 3.4028234663852886e38, 1.401298464324817e-45, 0.0, -0.0, 1e-3])},
        {"b": ("bytes", [b"", b"hello", bytes(range(256))])},
        {"input_ids": ("int64", [-1, 2**63 - 1, -(2**63), 0, 127, 128, 300]),
         "label": ("bytes", [b"caf\xc3\xa9"]), "w": ("float", [1.5, -0.25])},
        {"e64": ("int64", []), "ef": ("float", []), "eb": ("bytes", [])},  # empty lists
        {"blob": ("bytes", [big_bytes]), "input_ids": ("int64", rng.randint(0, 50257, size=200_000).tolist())},
        {"input_ids": ("int64", rng.randint(-2**62, 2**62, size=150_000, dtype=np.int64).tolist())},
    ]
    for n in range(20):  # many small ones, as data prepare writes
        records.append({"input_ids": ("int64", rng.randint(0, 50257, size=int(rng.randint(1, 1025))).tolist())})
    return records


def describe(kind, values):
    if kind == "int64":
        out = [int(v) for v in values]
    elif kind == "float":
        out = [float(np.float32(v)) for v in values]
    else:
        out = [bytes(v).hex() for v in values]
    return {"kind": kind, "values": out}


def write(args):
    records = oracle_records()
    with tf.io.TFRecordWriter(args.out, options=options(args.compression)) as writer:
        for record in records:
            example = tf.train.Example(features=tf.train.Features(
                feature={key: feature(kind, values) for key, (kind, values) in record.items()}))
            writer.write(example.SerializeToString())
    expect = [{key: describe(kind, values) for key, (kind, values) in record.items()} for record in records]
    with open(args.expect, "w") as f:
        json.dump(expect, f)


KINDS = {"int64_list": ("int64", tf.int64), "float_list": ("float", tf.float32), "bytes_list": ("bytes", tf.string)}


def read(args):
    out = []
    dataset = tf.data.TFRecordDataset([args.file], compression_type=options(args.compression))
    for serialized in dataset:
        proto = tf.train.Example.FromString(serialized.numpy())
        kinds = {}
        for key, value in proto.features.feature.items():
            which = value.WhichOneof("kind")
            if which is None:
                raise ValueError(f"feature {key!r} has no kind set")
            kinds[key] = KINDS[which]
        spec = {key: tf.io.VarLenFeature(dtype) for key, (_, dtype) in kinds.items()}
        if not spec:  # parse_single_example needs one feature: ask for one that is absent
            spec = {"__absent__": tf.io.VarLenFeature(tf.int64)}
        parsed = tf.io.parse_single_example(serialized, spec)
        record = {}
        for key, (kind, _) in kinds.items():
            values = parsed[key].values.numpy().tolist()
            record[key] = describe(kind, values)
        if not kinds and parsed["__absent__"].values.shape[0] != 0:
            raise ValueError("absent feature parsed as non-empty")
        out.append(record)
    json.dump(out, sys.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--compression", choices=["NONE", "GZIP", "ZLIB"], required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--expect", required=True)
    r = sub.add_parser("read")
    r.add_argument("--compression", choices=["NONE", "GZIP", "ZLIB"], required=True)
    r.add_argument("file")
    args = parser.parse_args()
    print(f"tensorflow {tf.__version__}", file=sys.stderr)
    try:
        write(args) if args.command == "write" else read(args)
    except Exception as e:  # noqa: BLE001
        print(f"tf_tfrecord.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
