#!/usr/bin/env python3
"""deploy/: the Kubernetes manifests, checked as a cluster would check them before running them,
and the image's package list.

- Every object of a built-in kind is validated, strictly (unknown fields refused), against the
  Kubernetes API's own JSON schemas (the kubernetes-validate package, Kubernetes 1.37).
- The Kubeflow TFJob (a custom resource, whose schema the training operator installs and no
  PyPI package ships) is checked for the fields of kubeflow.org/v1's TFJobSpec and ReplicaSpec,
  and each of its pod templates against the Kubernetes schema of a PodTemplateSpec.
- The objects agree with each other: the Indexed Job's pods resolve through the headless
  Service (subdomain = Service, selector = labels, the rendezvous port exposed), the volume
  claims exist, and the task count the entrypoint is told is the Job's completion count.
- deploy/Dockerfile installs every Debian package scripts/setup.sh installs to build paraflow
  (the image cannot be built here: no Docker engine).
The TF_CONFIG each pod's entrypoint builds is parsed by the trainer's own parser in
tests/dist/kubernetes_tf_config_test.cc.
"""
import re
import sys
from pathlib import Path

import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.37.0"
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
TFJOB_SPEC_FIELDS = {"runPolicy", "successPolicy", "enableDynamicWorker", "tfReplicaSpecs"}
RUN_POLICY_FIELDS = {"activeDeadlineSeconds", "backoffLimit", "cleanPodPolicy", "managedBy", "schedulingPolicy",
                     "suspend", "ttlSecondsAfterFinished"}
REPLICA_TYPES = {"Chief", "Master", "Worker", "PS", "Evaluator"}
REPLICA_FIELDS = {"replicas", "restartPolicy", "template"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def validate_builtin(obj, where):
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        failures.append(f"{where}: {error.message} at {'.'.join(map(str, error.path))}")


def validate_tfjob(job, where):
    check(job.get("apiVersion") == "kubeflow.org/v1", f"{where}: apiVersion {job.get('apiVersion')}")
    check(set(job) <= {"apiVersion", "kind", "metadata", "spec"}, f"{where}: unknown top-level fields {set(job)}")
    spec = job.get("spec", {})
    check(set(spec) <= TFJOB_SPEC_FIELDS, f"{where}: unknown spec fields {set(spec) - TFJOB_SPEC_FIELDS}")
    check(set(spec.get("runPolicy", {})) <= RUN_POLICY_FIELDS, f"{where}: unknown runPolicy fields")
    replicas = spec.get("tfReplicaSpecs", {})
    check(replicas, f"{where}: no tfReplicaSpecs")
    for kind, replica in replicas.items():
        here = f"{where} tfReplicaSpecs.{kind}"
        check(kind in REPLICA_TYPES, f"{here}: not a TFJob replica type ({sorted(REPLICA_TYPES)})")
        check(set(replica) <= REPLICA_FIELDS, f"{here}: unknown fields {set(replica) - REPLICA_FIELDS}")
        check(isinstance(replica.get("replicas", 1), int), f"{here}: replicas is not an integer")
        check(replica.get("restartPolicy", "Never") in RESTART_POLICIES, f"{here}: restartPolicy")
        validate_builtin({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": kind.lower()},
                          "template": replica.get("template", {})}, here + ".template")
        containers = replica.get("template", {}).get("spec", {}).get("containers", [])
        # The operator sets TF_CONFIG on (and reads the exit code of) the container named tensorflow.
        check(any(c.get("name") == "tensorflow" for c in containers), f"{here}: no container named tensorflow")


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def check_indexed_job_wiring(objects, where):
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for job in (o for o in objects if o["kind"] == "Job"):
        name, spec = job["metadata"]["name"], job["spec"]
        pod = spec["template"]["spec"]
        for volume in pod.get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            check(claim is None or claim in claims, f"{where} job/{name}: claim {claim} is not defined")
        container = pod["containers"][0]
        env = env_of(container)
        check(env.get("PARAFLOW_JOB") == name.removesuffix("-evaluator"),
              f"{where} job/{name}: PARAFLOW_JOB {env.get('PARAFLOW_JOB')}")
        service = services.get(env.get("PARAFLOW_SERVICE"))
        check(service is not None, f"{where} job/{name}: PARAFLOW_SERVICE names no Service")
        if spec.get("completionMode") != "Indexed":
            continue
        check(str(spec["completions"]) == env.get("PARAFLOW_TASKS") and spec["parallelism"] == spec["completions"],
              f"{where} job/{name}: PARAFLOW_TASKS {env.get('PARAFLOW_TASKS')} against {spec['completions']} "
              f"completions, parallelism {spec['parallelism']}")
        check(pod.get("subdomain") == service["metadata"]["name"],
              f"{where} job/{name}: pods' subdomain {pod.get('subdomain')} is not the Service")
        labels = spec["template"]["metadata"]["labels"]
        check(all(labels.get(k) == v for k, v in service["spec"]["selector"].items()),
              f"{where} job/{name}: the Service's selector does not select its pods")
        port = int(env.get("PARAFLOW_PORT", 2222))
        check(port in [p["port"] for p in service["spec"]["ports"]], f"{where}: the Service does not expose {port}")
        check(port in [p["containerPort"] for p in container.get("ports", [])], f"{where}: the pod does not expose {port}")


def check_image_packages():
    setup = (ROOT / "scripts/setup.sh").read_text()
    build_packages = set(re.search(r"^PACKAGES=\((.*?)^\)", setup, re.S | re.M).group(1).split())
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    installed = set(re.search(r"apt-get install -y --no-install-recommends(.*?)&&", dockerfile, re.S).group(1)
                    .replace("\\", " ").split())
    missing = build_packages - installed
    check(not missing, f"deploy/Dockerfile does not install {sorted(missing)}, which scripts/setup.sh's build needs")


def main():
    check_image_packages()
    manifests = sorted(DEPLOY.glob("*.yaml"))
    check(manifests, f"no manifests in {DEPLOY}")
    for path in manifests:
        objects = [o for o in yaml.safe_load_all(path.read_text()) if o]
        for index, obj in enumerate(objects):
            where = f"{path.name} document {index} ({obj.get('kind')})"
            if obj.get("kind") == "TFJob":
                validate_tfjob(obj, where)
            else:
                validate_builtin(obj, where)
        check_indexed_job_wiring(objects, path.name)
        print(f"{path.name}: {len(objects)} objects checked")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
