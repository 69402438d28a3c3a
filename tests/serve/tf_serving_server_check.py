"""`paraflow serve` started the way TF Serving is, checked with TF Serving's own Python client
(tensorflow-serving-api, in .venv-data) and plain HTTP: its Docker command line's flags, a config
file that labels versions, a config reloaded while clients keep asking (file polling and gRPC
HandleReloadConfigRequest), and the refusals at start (a base path that is a file, a busy gRPC
port, a label on a version never loaded). Any mismatch raises (exit status 1).

    tf_serving_server_check.py --paraflow BINARY --model EXPORT_DIR --work DIR

EXPORT_DIR is a byte-level model with 96 positions (tests/serve/server_process_test.cc); each
server runs in its own process on 127.0.0.1, on ports the system picks.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--paraflow", required=True)
parser.add_argument("--model", required=True)
parser.add_argument("--work", required=True)
args = parser.parse_args()

KEY = "tf-key"
SMALL = ["--threads", "1", "--kv-cache-gb", "0.002"]
STATUS = get_model_status_pb2.ModelVersionStatus


def versions(base, *numbers):
    """A TF Serving base path holding `numbers` as versions (links to the one export dir)."""
    path = os.path.join(args.work, base)
    os.makedirs(path, exist_ok=True)
    for number in numbers:
        if not os.path.exists(os.path.join(path, str(number))):
            os.symlink(args.model, os.path.join(path, str(number)))
    return path


def write(name, text):
    """Writes a file whole (a rename), so a server polling it never reads half of it."""
    path = os.path.join(args.work, name)
    with open(path + ".part", "w") as out:
        out.write(text)
    os.replace(path + ".part", path)
    return path


class Server:
    def __init__(self, flags):
        self.log_path = os.path.join(args.work, f"serve-{time.monotonic_ns()}.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen([args.paraflow, "serve", *flags], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (ready := re.search(r"ready on http://127\.0\.0\.1:(\d+)", self.log())):
            assert self.process.poll() is None and time.monotonic() < deadline, f"not ready:\n{self.log()}"
            time.sleep(0.05)
        self.http = int(ready[1])
        grpc_port = re.search(r"grpc listening on 127\.0\.0\.1:(\d+)", self.log())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port[1]}") if grpc_port else None

    def log(self):
        with open(self.log_path) as log:
            return log.read()

    def stop(self):
        self.process.kill()
        self.process.wait()


def refused_at_start(flags, *says, code=1):
    """`paraflow serve flags` exits with `code` at start (1: bad input), its message holding each of `says`."""
    run = subprocess.run([args.paraflow, "serve", *flags], capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr
    assert run.returncode == code, (run.returncode, output)
    for part in says:
        assert part in output, (part, output)
    print(f"  refused at start: {output.strip().splitlines()[-1]}")
    return output


def http(server, method, path, body=None, key=KEY):
    """(status, parsed JSON body or text) of one HTTP request."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{server.http}{path}", data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            status, text = reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def label_version(server, model, label):
    status, body = http(server, "GET", f"/v1/models/{model}/labels/{label}")
    return body["model_version_status"][0]["version"] if status == 200 else None


def states(server, model):
    status, body = http(server, "GET", f"/v1/models/{model}")
    return {v["version"]: v["state"] for v in body["model_version_status"]} if status == 200 else status


def eventually(condition, what, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def grpc_predict(server, model, ids, key=KEY):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["input_ids"].CopyFrom(tf.make_tensor_proto(np.array(ids), dtype=tf.int32))
    request.inputs["max_new_tokens"].CopyFrom(tf.make_tensor_proto(8))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(server.channel)
    reply = stub.Predict(request, timeout=60, metadata=[("authorization", f"Bearer {key}")])
    return tf.make_ndarray(reply.outputs["output_ids"]).tolist()


PROMPT = list(b"the quick")

# 1. TF Serving's Docker command line, flags with '=': --port is gRPC's once --rest_api_port is
# given; the flags that map take effect, the others are accepted and noted in the log.
monitoring = write("monitoring.config", 'prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
tf_like = Server([
    "--port=0", "--rest_api_port=0", f"--model_base_path={versions('base', 1)}", "--model_name=gpt",
    "--rest_api_timeout_in_ms=30000", "--enable_model_warmup=true", "--tensorflow_intra_op_parallelism=1",
    "--tensorflow_inter_op_parallelism=2", "--rest_api_num_threads=2", f"--monitoring_config_file={monitoring}",
    "--enable_batching=true", "--file_system_poll_wait_seconds=1", "--kv-cache-gb=0.002", f"--api-key={KEY}",
])
assert tf_like.channel is not None, tf_like.log()
status, body = http(tf_like, "POST", "/v1/models/gpt:predict", {"instances": [{"input_ids": PROMPT, "max_new_tokens": 8}]})
assert status == 200, body
assert grpc_predict(tf_like, "gpt", [PROMPT]) == body["predictions"], body
for flag in ("--enable_model_warmup", "--tensorflow_inter_op_parallelism"):
    assert f"{flag}: accepted for TF Serving's command lines" in tf_like.log(), (flag, tf_like.log())
status, metrics = http(tf_like, "GET", "/monitoring/prometheus/metrics")
assert status == 200 and "paraflow_http_requests_total" in metrics, (status, metrics)
assert http(tf_like, "GET", "/monitoring/prometheus/metrics", key=None)[0] == 401
# Without the key, TF Serving's paths answer TF Serving's error shape: {"error": "<message>"}.
status, body = http(tf_like, "POST", "/v1/models/gpt:predict", {"instances": [PROMPT]}, key=None)
assert status == 401 and isinstance(body, dict) and list(body) == ["error"] and "API key" in body["error"], body
print(f"  TF Serving command line: REST on {tf_like.http}, gRPC on --port; 401 {body}")
tf_like.stop()
# --rest_api_timeout_in_ms: a :predict still waiting for its batch (300 ms here) when its 50 ms are
# up is stopped and answered 504, as TF Serving answers DEADLINE_EXCEEDED; gRPC has its own deadlines.
batching = write("batching.config", "max_batch_size { value: 8 } batch_timeout_micros { value: 300000 }\n")
timed = Server(["--model", args.model, "--port=0", "--rest_api_port=0", "--rest_api_timeout_in_ms=50",
                "--enable_batching", f"--batching_parameters_file={batching}", f"--api-key={KEY}", *SMALL])
status, body = http(timed, "POST", "/v1/models/tiny-gpt:predict", {"instances": [PROMPT]})
assert status == 504 and "deadline exceeded" in body["error"], (status, body)
assert len(grpc_predict(timed, "tiny-gpt", [PROMPT])[0]) == 8
timed.stop()
refused_at_start(["--port", "0", "--rest_api_port", "0", "--grpc-port", "0", "--model", args.model],
                 "--port 0 with --rest_api_port is TF Serving's gRPC port", "--grpc-port")

# 2. Refused at start, naming the flag and what is wrong: a base path that is a file, a busy gRPC
# port (without gRPC's own log of it), a label on a version that never loaded.
weights = os.path.join(args.model, "model.safetensors")
refused_at_start(["--model_base_path", weights, *SMALL], f"--model_base_path {weights}: is a file, not a folder")
with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    output = refused_at_start(["--model", args.model, "--port", "0", "--grpc-port", str(taken), *SMALL],
                              f"--grpc-port {taken}: gRPC cannot listen on 127.0.0.1:{taken}", code=2)
    assert ".cc:" not in output and "created" not in output, f"gRPC's own log:\n{output}"
labelled = write("labelled.config", f"""model_config_list {{ config {{
  name: "a" base_path: "{versions('a', 1)}"
  version_labels {{ key: "stable" value: 1 }} version_labels {{ key: "next" value: 3 }}
}} }}""")
refused_at_start(["--model_config_file", labelled, "--port", "0", *SMALL],
                 'version label "next" names version 3, which is not available',
                 "--allow_version_labels_for_unavailable_models")
allowed = Server(["--model_config_file", labelled, "--port", "0", "--allow_version_labels_for_unavailable_models", *SMALL])
assert label_version(allowed, "a", "stable") == "1"
status, body = http(allowed, "POST", "/v1/models/a/labels/next:predict", {"instances": [PROMPT]})
assert status == 404 and "no version 3" in body["error"], (status, body)
status, body = http(allowed, "POST", "/v1/models/a/labels/beta:predict", {"instances": [PROMPT]})
assert status == 400 and 'no version label "beta"' in body["error"], (status, body)  # TF Serving's INVALID_ARGUMENT
allowed.stop()


# 3. The config reloaded while three clients keep asking for model a (by label and newest):
# models added and removed, labels moved, through the file and through gRPC; no request fails.
def config(*models):
    entries = []
    for name, base, policy, labels in models:
        label_text = " ".join(f'version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items())
        entries.append(f'config {{ name: "{name}" base_path: "{base}" model_version_policy {{ {policy} }} {label_text} }}')
    return "model_config_list {\n" + "\n".join(entries) + "\n}\n"


a_base, b_base = versions("reload-a", 1, 2), versions("reload-b", 4)
watched = write("watched.config", config(("a", a_base, "specific { versions: 1 }", {"stable": 1})))
server = Server(["--model_config_file", watched, "--model_config_file_poll_wait_seconds=0.1", "--port=0",
                 "--rest_api_port=0", f"--api-key={KEY}", *SMALL])
stop, failures, served = threading.Event(), [], [0]


def client(path):
    while not stop.is_set():
        status, body = http(server, "POST", path, {"instances": [{"input_ids": PROMPT, "max_new_tokens": 4}]})
        if status == 200:
            served[0] += 1
        else:
            failures.append((path, status, body))


clients = [threading.Thread(target=client, args=(path,))
           for path in ("/v1/models/a/labels/stable:predict", "/v1/models/a:predict", "/v1/models/a/labels/stable:predict")]
for thread in clients:
    thread.start()
write("watched.config", config(("a", a_base, "specific { versions: 1 versions: 2 }", {"stable": 1, "canary": 2}),
                               ("b", b_base, "latest { num_versions: 1 }", {})))
eventually(lambda: states(server, "b") == {"4": "AVAILABLE"} and label_version(server, "a", "canary") == "2", "b and canary")
assert http(server, "POST", "/v1/models/b:predict", {"instances": [PROMPT]})[0] == 200
write("watched.config", config(("a", a_base, "specific { versions: 2 }", {"stable": 2})))
eventually(lambda: states(server, "b") == 404 and states(server, "a") == {"2": "AVAILABLE", "1": "END"}, "b removed, a at 2")
assert label_version(server, "a", "stable") == "2"
write("watched.config", "model_config_list { config { name: 'a' nam: 'x' } }")  # a typo: reported, nothing changes
eventually(lambda: "watched.config:1:" in server.log() and "the reload failed" in server.log(), "the typo reported")

# gRPC HandleReloadConfigRequest: model c added (the file, unchanged since, is not read again);
# a label on a version not available is refused, naming it, and the rest still applies.
reload_request = model_management_pb2.ReloadConfigRequest()
entry = reload_request.config.model_config_list.config.add(name="a", base_path=a_base)
entry.model_version_policy.specific.versions.append(2)
entry.version_labels["stable"] = 2
reload_request.config.model_config_list.config.add(name="c", base_path=b_base)
models = model_service_pb2_grpc.ModelServiceStub(server.channel)
auth = [("authorization", f"Bearer {KEY}")]
reply = models.HandleReloadConfigRequest(reload_request, timeout=60, metadata=auth)
assert reply.status.error_code == 0, reply
status_request = get_model_status_pb2.GetModelStatusRequest()
status_request.model_spec.name = "c"
assert [v.state for v in models.GetModelStatus(status_request, timeout=10, metadata=auth).model_version_status] == [STATUS.AVAILABLE]
entry.version_labels["stable"] = 9
try:
    models.HandleReloadConfigRequest(reload_request, timeout=60, metadata=auth)
    raise AssertionError("a label on version 9 was accepted")
except grpc.RpcError as error:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "names version 9" in error.details(), error.details()
    print(f"  reload refused: {error.details()}")
assert label_version(server, "a", "stable") == "2"
stop.set()
for thread in clients:
    thread.join()
assert not failures, failures[:3]
assert served[0] > 0
print(f"  {served[0]} predictions served across the reloads, none failed")
server.stop()
print("tf_serving_server_check: ok")
