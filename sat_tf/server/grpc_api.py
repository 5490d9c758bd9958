"""TF Serving's gRPC API over the `Manager` (model_servers/prediction_service_impl.cc,
model_service_impl.cc); it only translates: `PredictionService.Predict` and
`GetModelMetadata`, `ModelService.GetModelStatus` and `HandleReloadConfigRequest` (the
request's `ModelServerConfig` checked as a config file is, then served as
`Manager.reload_config` serves it: the answer comes once new models are loaded).

A request's `model_spec` names a version by number or by `version_label`; without either
it gets the newest AVAILABLE one. Its gRPC deadline is the predict's deadline (past it,
DEADLINE_EXCEEDED, a request still queued leaving the queue); every error aborts the
call with its canonical code. Once the server drains, a new Predict is refused with
UNAVAILABLE (as a stopped gRPC server refuses it, while the port stays open for health
checks); the calls under way finish.
"""

import time

import grpc

from sat_tf.server import batching, errors, model_config, observer, reports, servable
from sat_tf.server.errors import ServingError

RELOAD = "HandleReloadConfigRequest"  # names the request in a refused config's message


def _version(spec):
    """(version or None, label or None) of a `ModelSpec`."""
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return spec.version.value, None
    if choice == "version_label":
        return None, spec.version_label
    return None, None


def _served(manager, context, name, api, answer):
    """`answer()`'s response, or the call aborted with its error's code; the observer is
    told of it either way."""
    start, examples = time.perf_counter(), [0]
    try:
        response, code = answer(examples), "OK"
    except Exception as e:  # noqa: BLE001 - every error answers with its code
        error = errors.from_exception(e, f"gRPC {api} of {name}")
        response, code = error, error.code
    observer.tell(
        "the request report",
        manager.observer.request,
        name,
        api,
        "GRPC",
        code,
        time.perf_counter() - start,
        examples[0],
    )
    if code != "OK":
        context.abort(getattr(grpc.StatusCode, code), response.message)
    return response


def _predict(manager, request, context, examples):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    if manager.draining.is_set():
        raise ServingError("UNAVAILABLE", "the server is draining: it takes no new request")
    spec = request.model_spec
    version, label = _version(spec)
    try:
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
    except (TypeError, ValueError) as e:
        raise ServingError("INVALID_ARGUMENT", f"an input tensor does not parse: {e}") from None
    examples[0] = servable.examples(inputs)
    left = context.time_remaining()
    deadline = None
    if left is not None:
        deadline = batching.Deadline.after(left, "the gRPC deadline", "DEADLINE_EXCEEDED")
    with manager.servable(spec.name, version, label) as held:
        outputs = held.predict(spec.signature_name, inputs, deadline)
        served = held.version
    wanted = list(request.output_filter) or list(outputs)
    for name in wanted:
        if name not in outputs:
            raise ServingError(
                "INVALID_ARGUMENT", f"output tensor alias not found in signature: {name}"
            )
    response = predict_pb2.PredictResponse()
    response.model_spec.name = spec.name
    response.model_spec.version.value = served
    response.model_spec.signature_name = spec.signature_name or servable.DEFAULT_SIGNATURE
    for name in wanted:
        response.outputs[name].CopyFrom(tf.make_tensor_proto(outputs[name]))
    return response


def _metadata(manager, request):
    spec = request.model_spec
    if list(request.metadata_field) != ["signature_def"]:
        raise ServingError(
            "INVALID_ARGUMENT", "metadata_field must be exactly [signature_def], the one served"
        )
    version, label = _version(spec)
    with manager.servable(spec.name, version, label) as held:
        return reports.metadata_response(spec.name, held.version, held.signature_defs)


def _status(manager, request):
    spec = request.model_spec
    version, label = _version(spec)
    if label is not None:
        version = manager.resolve(spec.name, label)
    return reports.status_response(manager.status(spec.name, version))


def _reload(manager, request):
    from tensorflow_serving.apis import model_management_pb2

    config = request.config
    if config.WhichOneof("config") != "model_config_list":
        raise ServingError(
            "INVALID_ARGUMENT",
            "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
            "ModelConfigList is currently supported",
        )
    model_config.check_model_server_config(config, RELOAD)
    model_config.check_base_paths(config, RELOAD)
    manager.reload_config(config)
    response = model_management_pb2.ReloadConfigResponse()
    response.status.SetInParent()  # error_code OK
    return response


def servicers(manager):
    """(PredictionService servicer, ModelService servicer) over `manager`; add them to a
    `grpc.server` with `add_PredictionServiceServicer_to_server` and
    `add_ModelServiceServicer_to_server`."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802 - the proto's name
            return _served(
                manager,
                context,
                request.model_spec.name,
                "predict",
                lambda examples: _predict(manager, request, context, examples),
            )

        def GetModelMetadata(self, request, context):  # noqa: N802
            return _served(
                manager,
                context,
                request.model_spec.name,
                "get_model_metadata",
                lambda _: _metadata(manager, request),
            )

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        def GetModelStatus(self, request, context):  # noqa: N802
            return _served(
                manager,
                context,
                request.model_spec.name,
                "get_model_status",
                lambda _: _status(manager, request),
            )

        def HandleReloadConfigRequest(self, request, context):  # noqa: N802
            return _served(
                manager, context, "", "handle_reload_config", lambda _: _reload(manager, request)
            )

    return PredictionService(), ModelService()
