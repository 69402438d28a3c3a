"""Parses `paraflow serve`'s /metrics with prometheus_client's text parser (the format's reference
implementation) and checks the families a dashboard needs, with sane values for an idle server.

Usage: metrics_check.py --url http://127.0.0.1:PORT/metrics --api-key KEY
"""
import argparse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    args = parser.parse_args()
    request = urllib.request.Request(args.url, headers={"Authorization": f"Bearer {args.api_key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4"), response.headers
        text = response.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}

    def value(name, suffix="", **labels):
        return sum(sample.value for sample in families[name].samples
                   if sample.name == name + suffix and all(sample.labels.get(k) == v for k, v in labels.items()))

    expected = {
        "paraflow_requests_running": "gauge", "paraflow_requests_waiting": "gauge",
        "paraflow_kv_blocks_free": "gauge", "paraflow_kv_blocks_total": "gauge", "paraflow_kv_blocks_used": "gauge",
        "paraflow_http_connections": "gauge",
        # prometheus_client names counter families without their _total suffix
        "paraflow_prompt_tokens": "counter", "paraflow_generation_tokens": "counter",
        "paraflow_http_requests": "counter",
        "paraflow_time_to_first_token_seconds": "histogram", "paraflow_inter_token_latency_seconds": "histogram",
        "paraflow_request_latency_seconds": "histogram", "paraflow_request_queue_seconds": "histogram",
        "paraflow_batch_tokens": "histogram",
    }
    for name, kind in expected.items():
        assert name in families, f"{name} missing; have {sorted(families)}"
        assert families[name].type == kind, (name, families[name].type)
    assert value("paraflow_requests_running") == 0 and value("paraflow_requests_waiting") == 0
    assert value("paraflow_kv_blocks_total") > 0
    # the engine's series carry the model and version they count
    assert value("paraflow_kv_blocks_total", model="tiny-gpt", version="1") == value("paraflow_kv_blocks_total")
    assert value("paraflow_kv_blocks_free") == value("paraflow_kv_blocks_total")
    assert value("paraflow_generation_tokens", "_total") > 0
    assert value("paraflow_http_requests", "_total", endpoint="/v1/completions", code="200") >= 1
    assert value("paraflow_http_connections") >= 1  # this one
    latency = value("paraflow_request_latency_seconds", "_count")
    assert latency >= 1 and value("paraflow_request_latency_seconds", "_bucket", le="+Inf") == latency
    assert value("paraflow_request_latency_seconds", "_sum") > 0
    print(f"prometheus_client parsed {len(families)} metric families: ok")


if __name__ == "__main__":
    main()
