"""A resources server for the trace tests: tells which worker handled a request, and the trace headers it saw."""

from fastapi import FastAPI, Request

from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class TraceEchoServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/trace")(self.trace)
        return app

    async def trace(self, request: Request) -> dict:
        return {"worker": self.worker_id, "traceparent": request.headers.get("traceparent"), "tracestate": request.headers.get("tracestate")}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    TraceEchoServer.run_webserver()
