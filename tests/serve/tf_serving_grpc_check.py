"""TF Serving's own Python client (tensorflow-serving-api, in .venv-data) against
`paraflow serve --grpc-port`: Predict with tf.make_tensor_proto / tf.make_ndarray, the greedy
tokens against HTTP /v1/completions, GetModelMetadata, GetModelStatus, and the error codes.
Any mismatch raises (exit status 1).

    tf_serving_grpc_check.py --grpc-port P --http-port Q --model NAME --api-key KEY

The model is byte-level (token id = byte) with 96 positions, serving at most 4 sequences with 4
waiting (tests/serve/server_process_test.cc).
"""
import argparse
import json
import os
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

parser = argparse.ArgumentParser()
parser.add_argument("--grpc-port", required=True)
parser.add_argument("--http-port", required=True)
parser.add_argument("--model", required=True)
parser.add_argument("--api-key", required=True)
args = parser.parse_args()

auth = [("authorization", f"Bearer {args.api_key}")]
channel = grpc.insecure_channel(f"127.0.0.1:{args.grpc_port}")
prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
model_service = model_service_pb2_grpc.ModelServiceStub(channel)

PROMPTS = [list(b"the quick brown"), list(b"over the lazy d")]  # a [2, 15] tensor
NEW_TOKENS = 24


def predict_request(ids, dtype=tf.int32, model=None, signature="serving_default", label=None, **scalars):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model or args.model
    request.model_spec.signature_name = signature
    if label:
        request.model_spec.version_label = label
    request.inputs["input_ids"].CopyFrom(tf.make_tensor_proto(np.array(ids), dtype=dtype))
    for name, value in scalars.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def predict(ids, **kwargs):
    return prediction.Predict(predict_request(ids, **kwargs), timeout=60, metadata=auth)


def refused(call, code, says):
    """Runs `call`, expecting a gRPC error with `code` whose details hold `says`."""
    try:
        call()
    except grpc.RpcError as error:
        assert error.code() == code, (error.code(), error.details())
        assert says in error.details(), (says, error.details())
        print(f"  {code.name}: {error.details()}")
        return
    raise AssertionError(f"accepted; expected {code.name} ({says})")


# Predict: a batch, then each row alone (int64 ids this time): the same greedy tokens.
response = predict(PROMPTS, max_new_tokens=NEW_TOKENS)
batched = tf.make_ndarray(response.outputs["output_ids"])
assert batched.dtype == np.int32 and batched.shape == (2, NEW_TOKENS), (batched.dtype, batched.shape)
assert response.model_spec.name == args.model and response.model_spec.version.value == 1, response.model_spec
for row, prompt in enumerate(PROMPTS):
    alone = tf.make_ndarray(predict([prompt], dtype=tf.int64, max_new_tokens=NEW_TOKENS).outputs["output_ids"])
    assert (alone[0] == batched[row]).all(), (alone[0], batched[row])
    print(f"  greedy: {bytes(prompt + batched[row].tolist())!r}")

# The same greedy tokens as HTTP /v1/completions with the prompt as token ids (the model is
# byte-level: the completion's text is the tokens' bytes).
for row, prompt in enumerate(PROMPTS):
    body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0})
    http = urllib.request.Request(
        f"http://127.0.0.1:{args.http_port}/v1/completions",
        body.encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {args.api_key}"},
    )
    text = json.load(urllib.request.urlopen(http, timeout=60))["choices"][0]["text"]
    assert bytes(batched[row].tolist()).decode("utf-8", "replace") == text, (batched[row], text)

# Sampling with a seed: the same request twice gives the same tokens.
sampled = [
    tf.make_ndarray(
        predict(PROMPTS, max_new_tokens=8, temperature=np.float32(1.0), seed=np.int64(7)).outputs["output_ids"]
    )
    for _ in range(2)
]
assert (sampled[0] == sampled[1]).all(), sampled

# The ids as int_val instead of tensor_content (what make_tensor_proto writes for numpy arrays).
request = predict_request(PROMPTS[:1], max_new_tokens=NEW_TOKENS)
as_field = request.inputs["input_ids"]
as_field.ClearField("tensor_content")
as_field.int_val.extend(PROMPTS[0])
request.output_filter.append("output_ids")
reply = prediction.Predict(request, timeout=60, metadata=auth)
assert (tf.make_ndarray(reply.outputs["output_ids"])[0] == batched[0]).all()

# GetModelMetadata: the signature in a SignatureDefMap packed in an Any, as TF Serving answers.
metadata_request = get_model_metadata_pb2.GetModelMetadataRequest()
metadata_request.model_spec.name = args.model
metadata_request.metadata_field.append("signature_def")
metadata = prediction.GetModelMetadata(metadata_request, timeout=10, metadata=auth)
signatures = get_model_metadata_pb2.SignatureDefMap()
assert metadata.metadata["signature_def"].Unpack(signatures)
signature = signatures.signature_def["serving_default"]
assert signature.method_name == "tensorflow/serving/predict"
assert set(signature.inputs) == {"input_ids", "max_new_tokens", "temperature", "seed"}, signature.inputs
assert signature.inputs["input_ids"].dtype == tf.int32.as_datatype_enum
assert [d.size for d in signature.inputs["input_ids"].tensor_shape.dim] == [-1, -1]
assert signature.inputs["temperature"].dtype == tf.float32.as_datatype_enum
assert signature.outputs["output_ids"].dtype == tf.int32.as_datatype_enum
# A scalar input's shape is there, with no dims (TF Serving's; tf.TensorShape reads it as a scalar).
assert signature.inputs["max_new_tokens"].HasField("tensor_shape"), signature.inputs["max_new_tokens"]
assert tf.TensorShape(signature.inputs["max_new_tokens"].tensor_shape).rank == 0

# GetModelStatus: version 1 AVAILABLE, status OK.
status_request = get_model_status_pb2.GetModelStatusRequest()
status_request.model_spec.name = args.model
status = model_service.GetModelStatus(status_request, timeout=10, metadata=auth)
assert len(status.model_version_status) == 1, status
version = status.model_version_status[0]
assert version.version == 1 and version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE, version
assert version.status.error_code == 0, version

# Errors: a clear message naming the field, the status code TF Serving would give.
codes = grpc.StatusCode
refused(lambda: predict(PROMPTS, model="gpt-5"), codes.NOT_FOUND, "model_spec.name")
refused(lambda: model_service.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(), timeout=10, metadata=auth),
        codes.NOT_FOUND, "model_spec.name")
refused(lambda: predict(PROMPTS, dtype=tf.float32), codes.INVALID_ARGUMENT, "input_ids: dtype is DT_FLOAT")
refused(lambda: predict(PROMPTS[0]), codes.INVALID_ARGUMENT, "input_ids: shape [15] is not [batch, length]")
refused(lambda: predict(PROMPTS, max_new_tokens=90), codes.INVALID_ARGUMENT, "max_new_tokens: 15 ids per row plus max_new_tokens 90")
refused(lambda: predict(PROMPTS, max_new_tokens=np.float32(3)), codes.INVALID_ARGUMENT, "max_new_tokens")
refused(lambda: predict([[300]]), codes.INVALID_ARGUMENT, "input_ids")  # beyond the 256-token vocabulary
# More rows than 4 running and 4 waiting: refused at once, naming the limit (never "retry later").
refused(lambda: predict([[116]] * 9, max_new_tokens=60), codes.INVALID_ARGUMENT, "send at most 8 rows per call")
# TF Serving's codes: an unknown label INVALID_ARGUMENT, an unknown signature FAILED_PRECONDITION.
refused(lambda: predict(PROMPTS, label="beta"), codes.INVALID_ARGUMENT, "model_spec.version_label")
refused(lambda: predict(PROMPTS, signature="classify_x"), codes.FAILED_PRECONDITION, "no signature \"classify_x\"")
# Classify and Regress: the model has only the Predict signature.
classify = classification_pb2.ClassificationRequest()
classify.model_spec.name = args.model
refused(lambda: prediction.Classify(classify, timeout=10, metadata=auth), codes.INVALID_ARGUMENT,
        "only the predict signature")
regress = regression_pb2.RegressionRequest()
regress.model_spec.name = args.model
refused(lambda: prediction.Regress(regress, timeout=10, metadata=auth), codes.INVALID_ARGUMENT, "Regress needs a")
refused(lambda: prediction.Classify(classify, timeout=10), codes.UNAUTHENTICATED, "authorization")
refused(lambda: channel.unary_unary("/tensorflow.serving.SessionService/SessionRun")(b"", timeout=10, metadata=auth),
        codes.UNIMPLEMENTED, "no method /tensorflow.serving.SessionService/SessionRun")
refused(lambda: prediction.Predict(predict_request(PROMPTS), timeout=10), codes.UNAUTHENTICATED, "authorization")
# Over the 16 MiB a message may hold.
refused(lambda: predict([[1] * (5 << 20)], dtype=tf.int32), codes.RESOURCE_EXHAUSTED, "")
# Bytes that are no PredictRequest: an error status (gRPC's callback API answers UNIMPLEMENTED), no crash.
raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
try:
    raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=10, metadata=auth)
    raise AssertionError("malformed bytes accepted")
except grpc.RpcError as error:
    assert error.code() != codes.OK
    print(f"  malformed: {error.code().name}: {error.details()}")

# Still serving after all that.
after = tf.make_ndarray(predict(PROMPTS, max_new_tokens=NEW_TOKENS).outputs["output_ids"])
assert (after == batched).all()
print("tf_serving_grpc_check: ok")
