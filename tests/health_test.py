"""gRPC health that follows the models' state: Check and Watch through a real gRPC
server on 127.0.0.1, across a version becoming AVAILABLE, a drain and a model leaving;
the end of the drain ends the Watch streams; the state as a manager gives it."""

import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sat_tf.server import health, observer
from sat_tf.server.errors import ServingError
from sat_tf.server.health import NOT_SERVING, SERVICE_UNKNOWN, SERVING, HealthService

DEADLINE = 10  # seconds any call or stream read may take


class State:
    """A server's state as the manager and the drain would report it."""

    def __init__(self, available):
        self.models, self.drain = dict(available), False

    def available(self):
        return dict(self.models)

    def draining(self):
        return self.drain


@pytest.fixture
def served():
    """(state, its HealthService, a Health stub) on a real gRPC server."""
    state = State({"a": False, "b": False})
    service = HealthService(state)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service.add_to_server(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield state, service, health_pb2_grpc.HealthStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def _check(stub, name):
    request = health_pb2.HealthCheckRequest(service=name)
    return stub.Check(request, timeout=DEADLINE).status


@pytest.mark.parametrize(
    "available, draining, server, models",
    [
        ({}, False, NOT_SERVING, {}),
        ({"a": False, "b": False}, False, NOT_SERVING, {"a": NOT_SERVING, "b": NOT_SERVING}),
        ({"a": True, "b": False}, False, SERVING, {"a": SERVING, "b": NOT_SERVING}),
        ({"a": True, "b": True}, False, SERVING, {"a": SERVING, "b": SERVING}),
        ({"a": True, "b": True}, True, NOT_SERVING, {"a": NOT_SERVING, "b": NOT_SERVING}),
    ],
)
def test_statuses_follow_availability_and_the_drain(available, draining, server, models):
    names = ("", "ModelService", "PredictionService", "tensorflow.serving.ModelService")
    expected = {name: server for name in (*names, "tensorflow.serving.PredictionService")}
    assert health.statuses(available, draining) == {**expected, **models}


def test_check_answers_each_name_from_the_state(served):
    state, service, stub = served
    assert [_check(stub, n) for n in ("", "ModelService", "a", "b")] == [NOT_SERVING] * 4
    state.models["a"] = True
    service.refresh()
    assert _check(stub, "") == SERVING
    assert _check(stub, "PredictionService") == SERVING
    assert _check(stub, "tensorflow.serving.PredictionService") == SERVING
    assert (_check(stub, "a"), _check(stub, "b")) == (SERVING, NOT_SERVING)
    with pytest.raises(grpc.RpcError) as caught:
        _check(stub, "no_such_model")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_streams_each_change_once_across_a_drain(served):
    state, service, stub = served
    server = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE)
    model = stub.Watch(health_pb2.HealthCheckRequest(service="a"), timeout=DEADLINE)
    try:
        assert (next(server).status, next(model).status) == (NOT_SERVING, NOT_SERVING)
        state.models["a"] = True
        service.refresh()
        assert (next(server).status, next(model).status) == (SERVING, SERVING)
        service.refresh()  # nothing changed: nothing is sent
        state.models["b"] = True  # changes "b" only
        service.refresh()
        state.drain = True
        service.refresh()
        assert (next(server).status, next(model).status) == (NOT_SERVING, NOT_SERVING)
        assert _check(stub, "b") == NOT_SERVING
    finally:
        server.cancel()
        model.cancel()


def test_the_managers_events_refresh_it(served):
    state, service, stub = served
    state.models["a"] = True
    service.version_changed(("a", 1, "AVAILABLE"))  # what the event holds is not read
    assert _check(stub, "a") == SERVING
    state.drain = True
    service.draining()
    assert (_check(stub, ""), _check(stub, "a")) == (NOT_SERVING, NOT_SERVING)


def test_a_model_that_leaves_the_config_becomes_unknown(served):
    state, service, stub = served
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="b"), timeout=DEADLINE)
    later = stub.Watch(health_pb2.HealthCheckRequest(service="c"), timeout=DEADLINE)
    try:
        assert (next(watch).status, next(later).status) == (NOT_SERVING, SERVICE_UNKNOWN)
        state.models = {"a": True, "c": True}
        service.refresh()
        assert (next(watch).status, next(later).status) == (SERVICE_UNKNOWN, SERVING)
        with pytest.raises(grpc.RpcError) as caught:
            _check(stub, "b")
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert _check(stub, "c") == SERVING
    finally:
        watch.cancel()
        later.cancel()


def test_close_ends_every_watch_and_refuses_new_ones(served):
    state, service, stub = served
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="a"), timeout=DEADLINE)
    assert next(watch).status == NOT_SERVING
    service.config_changed(None)  # a new config: read again, nothing changed
    service.close()
    assert list(watch) == []  # the stream ended
    later = stub.Watch(health_pb2.HealthCheckRequest(service="a"), timeout=DEADLINE)
    with pytest.raises(grpc.RpcError) as caught:
        next(later)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _check(stub, "a") == NOT_SERVING  # Check still answers


class Manager:
    """What ManagerState reads of a manager: its config, versions' states and drain."""

    def __init__(self, states):
        from tensorflow_serving.config import model_server_config_pb2

        self.config = model_server_config_pb2.ModelServerConfig()
        for name in states:
            self.config.model_config_list.config.add(name=name)
        self.states, self.draining = states, threading.Event()

    def status(self, name):
        if not self.states[name]:
            raise ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
        return [observer.VersionStatus(name, v, s, "OK", "") for v, s in self.states[name]]


def test_the_managers_state():
    manager = Manager({"a": [(2, "LOADING"), (1, "AVAILABLE")], "b": [(1, "END")], "c": []})
    state = health.ManagerState(manager)
    assert state.available() == {"a": True, "b": False, "c": False}
    assert not state.draining()
    manager.draining.set()
    assert state.draining()
