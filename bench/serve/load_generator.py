"""Load generator for OpenAI-compatible /v1/completions servers: N concurrent streaming clients,
each sending a fixed number of requests one after the other, from a fixed, seeded prompt set, with
`max_tokens` fixed and `temperature` 0. Asyncio on raw sockets (HTTP/1.1, chunked or plain
bodies, server-sent events), no third-party packages; the client's own CPU time is printed so
one can see it is not the bottleneck (it shares the machine with the server).

    python3 bench/serve/load_generator.py --url http://127.0.0.1:8080 --concurrency 8 \
        [--requests-per-client 2] [--max-tokens 64] [--prompt-tokens 32:128] [--prompt-kind text|ids]
        [--vocab 8192] [--seed 0] [--extra '{"ignore_eos": true}'] [--max-seconds 300] [--json OUT]

Measured per request, from the arrival times of the SSE chunks (time.perf_counter when the bytes
come off the socket): time to first token (request sent -> first chunk carrying a token),
inter-token latency (the gaps between successive token chunks), time per output token
((end-to-end - TTFT) / (tokens - 1)), end-to-end latency. Generated tokens are
`usage.completion_tokens` where the server reports it (OpenAI's `stream_options.include_usage`,
llama-server always), else the number of token chunks; both are kept, so a server that packs
several tokens into one chunk shows up (chunks < tokens). Throughput is all generated tokens over
the wall time from the first request sent to the last one finished.

Bounded: each request has a timeout, the whole run a deadline (--max-seconds); what has not
finished by then is cancelled and counted as cut (its tokens so far still count as generated).
Talks to whatever --url says; the scripts here only ever point it at 127.0.0.1.
"""
import argparse
import asyncio
import json
import os
import random
import resource
import sys
import time
import urllib.parse

# Common English words, each one GPT-2 token with its leading space (and within the first 8191
# ids of GPT-2's vocabulary, the cut vocabulary of make_gpt_small.py): a prompt of n words is ~n
# tokens for both servers. The servers' usage.prompt_tokens says what they counted.
WORDS = ("the of and to in is was for on that with as by at from his it an were are which be this has "
         "had not but first one their its new after who they have her she two been other when there all "
         "during into school time may years more most only over city some world would where later up such "
         "used many can state about national out known university united then made people part year "
         "could these so him under while three because between well house same each since four long "
         "music group both before very number name high work old through season day great life game "
         "back found family around several home off film north until second did what early south war "
         "just three way also last good any right small end much own public system team place how "
         "called west best water even following line side left power still main town form court").split()


def make_prompts(count, seed, min_tokens, max_tokens, kind, vocab):
    """`count` prompts, the same for every server given the same arguments: text of common words,
    or lists of token ids in [256, vocab - 1) (past the byte tokens, short of the last id, which
    make_gpt_small.py and GPT-2 give to <|endoftext|>)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        length = rng.randint(min_tokens, max_tokens)
        if kind == "ids":
            prompts.append([rng.randrange(256, vocab - 1) for _ in range(length)])
        else:
            words = [rng.choice(WORDS) for _ in range(length)]
            prompts.append(" ".join(words).capitalize())
    return prompts


class RequestResult:
    __slots__ = ("ok", "error", "start", "first", "end", "chunk_times", "usage_tokens", "prompt_tokens",
                 "finish_reason", "cut")

    def __init__(self):
        self.ok, self.error, self.cut = False, None, False
        self.start = self.first = self.end = None
        self.chunk_times = []
        self.usage_tokens = self.prompt_tokens = self.finish_reason = None

    @property
    def tokens(self):
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunk_times)


class ChunkedDecoder:
    """Incremental HTTP/1.1 chunked transfer decoding."""

    def __init__(self):
        self.buffer = b""
        self.remaining = None  # bytes left in the current chunk (None: expecting a size line)
        self.done = False

    def feed(self, data):
        self.buffer += data
        out = []
        while not self.done:
            if self.remaining is None:
                line_end = self.buffer.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(self.buffer[:line_end].split(b";")[0], 16)
                self.buffer = self.buffer[line_end + 2:]
                if size == 0:
                    self.done = True
                    break
                self.remaining = size
            if len(self.buffer) < self.remaining + 2:
                if len(self.buffer) > self.remaining:  # the chunk is in; its CRLF is not yet
                    break
                out.append(self.buffer)
                self.remaining -= len(self.buffer)
                self.buffer = b""
                break
            out.append(self.buffer[:self.remaining])
            self.buffer = self.buffer[self.remaining + 2:]
            self.remaining = None
        return b"".join(out)


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return status, headers


async def post(url, body, headers=None, timeout=60.0):
    """A plain (non-streaming) POST; returns (status, parsed JSON or text)."""
    parts = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port or 80), timeout)
    try:
        payload = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write((f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(payload)}\r\nConnection: close\r\n{extra}\r\n").encode() + payload)
        await writer.drain()

        async def body_of():
            status, response_headers = await read_head(reader)
            data = await reader.read()
            if response_headers.get("transfer-encoding", "").lower() == "chunked":
                data = ChunkedDecoder().feed(data)
            return status, data

        status, data = await asyncio.wait_for(body_of(), timeout)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data.decode("utf-8", "replace")
    finally:
        writer.close()


async def get(url, timeout=10.0):
    """A GET; returns (status, body text)."""
    parts = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port or 80), timeout)
    try:
        writer.write(f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()

        async def body_of():
            status, response_headers = await read_head(reader)
            data = await reader.read()
            if response_headers.get("transfer-encoding", "").lower() == "chunked":
                data = ChunkedDecoder().feed(data)
            return status, data.decode("utf-8", "replace")

        return await asyncio.wait_for(body_of(), timeout)
    finally:
        writer.close()


async def stream_completion(url, body, result, timeout, headers=None):
    """POSTs `body` (stream: true) and fills `result` as the SSE chunks arrive."""
    parts = urllib.parse.urlsplit(url)
    payload = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
               f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n{extra}\r\n"
               ).encode() + payload
    result.start = time.perf_counter()
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        writer.write(request)
        await writer.drain()
        status, response_headers = await read_head(reader)
        if status != 200:
            text = (await asyncio.wait_for(reader.read(), timeout)).decode("utf-8", "replace")
            result.error = f"HTTP {status}: {text[:300]}"
            return
        chunked = response_headers.get("transfer-encoding", "").lower() == "chunked"
        decoder = ChunkedDecoder() if chunked else None
        events = b""
        while True:
            data = await reader.read(65536)
            now = time.perf_counter()
            if not data:
                result.error = result.error or "connection closed before data: [DONE]"
                return
            events += decoder.feed(data) if chunked else data
            events = events.replace(b"\r\n", b"\n")
            while True:
                split = events.find(b"\n\n")
                if split < 0:
                    break
                event, events = events[:split], events[split + 2:]
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data_field = line[5:].strip()
                    if data_field == b"[DONE]":
                        result.end = now
                        result.ok = result.error is None
                        return
                    chunk = json.loads(data_field)
                    if "error" in chunk:
                        result.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                        continue
                    usage = chunk.get("usage")
                    if usage:
                        result.usage_tokens = usage.get("completion_tokens")
                        result.prompt_tokens = usage.get("prompt_tokens")
                    for choice in chunk.get("choices") or []:
                        if choice.get("finish_reason") is not None:
                            result.finish_reason = choice["finish_reason"]
                        # A token chunk: text, or an empty text before the end (a token whose
                        # bytes the server holds back until its UTF-8 character is complete).
                        if choice.get("text") or choice.get("finish_reason") is None:
                            result.chunk_times.append(now)
                            if result.first is None:
                                result.first = now
            if decoder is not None and decoder.done:
                result.error = result.error or "stream ended before data: [DONE]"
                return
    finally:
        writer.close()


def raise_priority(niceness=-10):
    """Gives this process (the client) priority over the servers' threads: it needs ~1% of a core,
    but on a 2-core machine whose cores the server keeps busy it must be scheduled as soon as a
    chunk arrives, or chunks pile up in the socket and arrive "together" (zero inter-token gaps,
    then a long one). Needs root (or CAP_SYS_NICE); returns the niceness in effect."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    position = (len(values) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


async def run_load(url, prompts, concurrency, requests_per_client, max_tokens, extra=None, max_seconds=300.0,
                   request_timeout=120.0, headers=None, model=None):
    """Runs the load; returns a dict of metrics. Client c sends prompts[(c * requests_per_client + i)
    % len(prompts)] for i in 0..requests_per_client-1, one after the other."""
    completions_url = url.rstrip("/") + "/v1/completions"
    results = []

    async def client(index):
        for i in range(requests_per_client):
            body = {"prompt": prompts[(index * requests_per_client + i) % len(prompts)], "max_tokens": max_tokens,
                    "temperature": 0, "stream": True}
            if model is not None:
                body["model"] = model
            body.update(extra or {})
            result = RequestResult()
            results.append(result)
            try:
                await asyncio.wait_for(stream_completion(completions_url, body, result, request_timeout, headers),
                                       request_timeout)
            except asyncio.TimeoutError:
                result.error = f"timed out after {request_timeout:.0f} s"
            except asyncio.CancelledError:
                result.cut = True
                raise
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                result.error = f"{type(e).__name__}: {e}"

    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tasks = [asyncio.ensure_future(client(i)) for i in range(concurrency)]
    done, pending = await asyncio.wait(tasks, timeout=max_seconds)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    end = max([r.end for r in results if r.end is not None] + [start])
    if pending:
        end = time.perf_counter()
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    wall = end - start
    client_cpu = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)

    ok = [r for r in results if r.ok]
    errors = [r.error for r in results if r.error]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [(r.end - r.first) / (r.tokens - 1) for r in ok if r.first is not None and r.tokens > 1]
    tokens = sum(r.tokens for r in results)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "planned": concurrency * requests_per_client,
        "completed": len(ok),
        "cut": sum(1 for r in results if r.cut) + concurrency * requests_per_client - len(results),
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "wall_s": wall,
        "generated_tokens": tokens,
        "token_chunks": sum(len(r.chunk_times) for r in results),
        "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
        "requests_per_s": len(ok) / wall if wall > 0 else float("nan"),
        "prompt_tokens_mean": (sum(r.prompt_tokens for r in ok if r.prompt_tokens is not None) /
                               max(1, sum(1 for r in ok if r.prompt_tokens is not None)))
        if any(r.prompt_tokens is not None for r in ok) else None,
        "finish_reasons": {reason: sum(1 for r in ok if r.finish_reason == reason)
                           for reason in sorted({str(r.finish_reason) for r in ok})},
        "short_requests": sum(1 for r in ok if r.tokens < max_tokens),
        "ttft_p50_s": percentile([r.first - r.start for r in ok if r.first is not None], 50),
        "ttft_p99_s": percentile([r.first - r.start for r in ok if r.first is not None], 99),
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
        "tpot_mean_s": sum(tpot) / len(tpot) if tpot else float("nan"),
        "e2e_p50_s": percentile([r.end - r.start for r in ok], 50),
        "e2e_p99_s": percentile([r.end - r.start for r in ok], 99),
        "client_cpu_fraction": client_cpu / wall if wall > 0 else float("nan"),
    }


HEADER = (f"{'server':<28} {'conc':>4} {'done':>8} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} "
          f"{'ITL p99':>8} {'TPOT':>7} {'E2E p50':>8} {'E2E p99':>8} {'client cpu':>10}")


def row(name, m):
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    done = f"{m['completed']}/{m['planned']}"
    return (f"{name:<28} {m['concurrency']:>4} {done:>8} {m['tokens_per_s']:8.1f} {ms(m['ttft_p50_s']):>9} "
            f"{ms(m['ttft_p99_s']):>9} {ms(m['itl_p50_s']):>8} {ms(m['itl_p99_s']):>8} {ms(m['tpot_mean_s']):>7} "
            f"{ms(m['e2e_p50_s']):>8} {ms(m['e2e_p99_s']):>8} {m['client_cpu_fraction'] * 100:9.1f}%")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1])
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", default="32:128", help="MIN:MAX prompt length, drawn per prompt")
    parser.add_argument("--prompt-kind", choices=["text", "ids"], default="text")
    parser.add_argument("--vocab", type=int, default=8192, help="token ids of --prompt-kind ids are below this")
    parser.add_argument("--seed", type=int, default=0, help="prompts of concurrency c: seed + c (no prompt repeats "
                        "across the runs, so no server serves one from its prefix cache)")
    parser.add_argument("--extra", default="{}", help="JSON object merged into every request body")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="deadline of each concurrency's run")
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--api-key")
    parser.add_argument("--json", help="write the metrics here")
    args = parser.parse_args()
    low, high = (int(x) for x in args.prompt_tokens.split(":"))
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    all_metrics = []
    print(f"client niceness {raise_priority()}")
    print(HEADER)
    for concurrency in args.concurrency:
        prompts = make_prompts(concurrency * args.requests_per_client, args.seed + concurrency, low, high, args.prompt_kind, args.vocab)
        metrics = asyncio.run(run_load(args.url, prompts, concurrency, args.requests_per_client, args.max_tokens,
                                       json.loads(args.extra), args.max_seconds, args.request_timeout, headers))
        all_metrics.append(metrics)
        print(row(args.url, metrics), flush=True)
        for error in metrics["first_errors"]:
            print(f"  error: {error}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_metrics, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
