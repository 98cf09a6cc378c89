"""gRPC's ReloadModel: a new version of a served model put in service (server/models/model_update.py), the
call answered once the update is done. NOT_FOUND for a model not served, UNAVAILABLE while starting or
draining; a version that failed is an answer (outcome "failed" and its reason), not an error."""

from __future__ import annotations

import grpc

from nvllm.server.models.model_set import UnknownModel
from nvllm.server.state import DaemonState, Refused
from nvllm.v1 import nvllm_pb2 as pb


async def reload_model(state: DaemonState, request: pb.ReloadModelRequest,
                       context: grpc.aio.ServicerContext) -> pb.ReloadModelResponse:
    try:
        state.check_serving()
        assert state.models is not None      # serving: the models were set
        done = await state.updates.reload(state.models, request.model)
    except Refused as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    except UnknownModel as e:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
    return pb.ReloadModelResponse(model=done.model, outcome=done.outcome, reason=done.reason)
