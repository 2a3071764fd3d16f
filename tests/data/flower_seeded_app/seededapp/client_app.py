"""The ClientApp: seeded from its partition id and the server round. For the bad-input
tests, $SEEDEDAPP_RAISE (a partition id) makes that client raise, $SEEDEDAPP_NAN (a
partition id) makes it reply with NaN in its arrays."""

import os

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from seededapp.task import load_data, make_net, test, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context):
    pid = int(context.node_config["partition-id"])
    net = make_net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    data, _ = load_data(pid, int(context.node_config["num-partitions"]))
    seed = 1000 * pid + int(msg.content["config"]["server-round"])
    epochs = int(context.run_config.get("local-epochs", 1))
    loss = train(net, data, epochs, float(msg.content["config"]["lr"]), seed)
    # a stateful client: how many times it trained, kept in its Context between rounds
    count = context.state["count"]["n"] + 1 if "count" in context.state else 1
    context.state["count"] = MetricRecord({"n": count})
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(data[1]), "times": count})
    if os.environ.get("SEEDEDAPP_RAISE") == str(pid):
        raise RuntimeError(f"partition {pid} was told to fail")
    state = net.state_dict()
    if os.environ.get("SEEDEDAPP_NAN") == str(pid):
        state = {k: torch.full_like(v, float("nan")) for k, v in state.items()}
    content = RecordDict({"arrays": ArrayRecord(state), "metrics": metrics})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context):
    pid = int(context.node_config["partition-id"])
    net = make_net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, data = load_data(pid, int(context.node_config["num-partitions"]))
    loss, acc = test(net, data)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(data[1])})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
