"""`paraflow serve` over TLS with the real clients, trusting a CA the test made (and nothing else):
  openai: the official openai client (its httpx client) on --ssl-certfile/--ssl-keyfile: a completion whole
          and streamed (the same text) on kept-alive connections, the models, a wrong key's 401;
          a client that does not trust the CA, and one speaking plain HTTP, get no answer.
  grpc:   TF Serving's gRPC client (grpcio, tensorflow-serving-api) on --grpc-port with
          --ssl_config_file (client_verify): GetModelStatus with the client's certificate; without
          one, or without TLS, the call fails.
Exits non-zero on any mismatch.

Usage: tls_check.py openai --url https://127.0.0.1:PORT --ca CA.pem --api-key KEY --model NAME
       tls_check.py grpc --port PORT --ca CA.pem --client-cert C.pem --client-key K.pem --api-key KEY --model NAME
"""
import argparse
import ssl


def check_openai(args):
    import openai

    def client(url=args.url, key=args.api_key, trust=True):
        verify = ssl.create_default_context(cafile=args.ca) if trust else True  # True: the system's CAs only
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60,
                             http_client=openai.DefaultHttpxClient(verify=verify))

    trusted = client()
    request = dict(model=args.model, prompt="the quick", max_tokens=8, temperature=0)
    whole = trusted.completions.create(**request)
    assert whole.usage.completion_tokens == 8, whole
    streamed = "".join(chunk.choices[0].text for chunk in trusted.completions.create(**request, stream=True)
                       if chunk.choices)
    assert streamed == whole.choices[0].text, (streamed, whole.choices[0].text)
    assert [model.id for model in trusted.models.list()] == [args.model]
    try:
        client(key="wrong-key").models.list()
        raise AssertionError("a wrong key was accepted over TLS")
    except openai.AuthenticationError:
        pass
    for name, other in (("a client that does not trust the CA", client(trust=False)),
                        ("plain HTTP", client(url=args.url.replace("https://", "http://")))):
        try:
            other.models.list()
            raise AssertionError(f"{name} got an answer")
        except openai.APIConnectionError as error:
            print(f"  {name}: refused ({error.__cause__!r})")
    print(f"  openai {openai.__version__} over TLS: {whole.choices[0].text!r}, the same streamed")


def check_grpc(args):
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    ca = open(args.ca, "rb").read()
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = args.model
    metadata = [("authorization", f"Bearer {args.api_key}")]

    def status(channel):
        with channel:
            return model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30, metadata=metadata)

    def secure(**certificate):
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, **certificate)
        # The certificate names localhost; the server listens on 127.0.0.1.
        return grpc.secure_channel(f"127.0.0.1:{args.port}", credentials,
                                   options=[("grpc.ssl_target_name_override", "localhost")])

    answer = status(secure(private_key=open(args.client_key, "rb").read(),
                           certificate_chain=open(args.client_cert, "rb").read()))
    states = [(version.version, version.state) for version in answer.model_version_status]
    assert states == [(1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)], answer
    for name, channel in (("no client certificate", secure()),
                          ("no TLS", grpc.insecure_channel(f"127.0.0.1:{args.port}"))):
        try:
            status(channel)
            raise AssertionError(f"{name}: the call was answered")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, (name, error)
            print(f"  grpc, {name}: {error.code().name}")
    print(f"  grpc {grpc.__version__} over TLS with a client certificate: GetModelStatus {states}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("client", choices=["openai", "grpc"])
    parser.add_argument("--url")
    parser.add_argument("--port")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--client-cert")
    parser.add_argument("--client-key")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    check_openai(args) if args.client == "openai" else check_grpc(args)


if __name__ == "__main__":
    main()
