"""TF Serving's answers about a model, built once for both APIs
(model_servers/get_model_status_impl.cc, get_model_metadata_impl.cc): gRPC sends the
messages, REST their JSON (`as_json`, printed as TF Serving prints them: field names as
in the proto, fields at their default value included).
"""

from sat_tf.server import observer


def status_response(statuses: list[observer.VersionStatus]):
    """The `GetModelStatusResponse` of `statuses` (in their order)."""
    from tensorflow_serving.apis import get_model_status_pb2

    response = get_model_status_pb2.GetModelStatusResponse()
    for status in statuses:
        entry = response.model_version_status.add(version=status.version)
        entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(status.state)
        entry.status.error_code = status.error_code
        entry.status.error_message = status.error_message
    return response


def metadata_response(name: str, version: int, signature_defs: dict):
    """The `GetModelMetadataResponse` of a version's `signature_def` metadata."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    signatures = get_model_metadata_pb2.SignatureDefMap()
    for key, value in signature_defs.items():
        signatures.signature_def[key].CopyFrom(value)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = name
    response.model_spec.version.value = version
    response.metadata["signature_def"].Pack(signatures)
    return response


def as_json(message) -> dict:
    """`message` as TF Serving's REST API prints it."""
    from google.protobuf import json_format

    return json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
