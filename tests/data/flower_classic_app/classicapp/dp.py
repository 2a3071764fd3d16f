"""The classic app with Flower's client-side differential privacy: the ClientApp with
fixedclipping_mod, the FedAvg wrapped in DifferentialPrivacyClientSideFixedClipping."""

from flwr.client import ClientApp
from flwr.client.mod import fixedclipping_mod
from flwr.server import ServerApp, ServerAppComponents
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping

from classicapp.client_app import client_fn
from classicapp.server_app import server_fn as plain_server_fn

client = ClientApp(client_fn=client_fn, mods=[fixedclipping_mod])


def server_fn(context):
    c = plain_server_fn(context)
    strategy = DifferentialPrivacyClientSideFixedClipping(
        c.strategy, noise_multiplier=0.1, clipping_norm=5.0, num_sampled_clients=4
    )
    return ServerAppComponents(strategy=strategy, config=c.config)


server = ServerApp(server_fn=server_fn)
