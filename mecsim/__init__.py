"""mecsim: a network-emulated Mobile Edge Computing testbed for personalised federated learning.

Real PyTorch training runs on Ray-hosted virtual clients; a SimPy model of the wireless
network and the device CPUs turns what the training did into the time a real testbed
would have taken. See README.md and docs/.
"""

__version__ = "0.1.0"
