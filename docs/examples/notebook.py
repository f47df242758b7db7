"""Your own model and data from Python: train once, then search (CPU, a few minutes).

Paste it into a notebook or run `python docs/examples/notebook.py` in an empty folder: it writes
mlruns/ there. tests/test_usercode.py runs this file as it is, so the README's copy must match it.
"""
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import triaccel


def make_data():
    d = load_digits()  # 1,797 8x8 images of digits, shipped with scikit-learn
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16  # [N, 1, 8, 8]
    y = torch.tensor(d.target)
    # no val split: 10 % of train is held out for validation (data.val_fraction), per class
    return triaccel.DataSplits(train=TensorDataset(x[:1500], y[:1500]), test=TensorDataset(x[1500:], y[1500:]))


def make_model(num_classes, in_channels, image_size, width=32):  # the data fills in what the signature names
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, width), nn.ReLU(),
                         nn.Linear(width, num_classes))


config = {"mode": "triaccel", "epochs": 3, "batch_size": 64, "device": "cpu",
          "model": {"init_args": {"width": 32}}}

result = triaccel.train(config, model=make_model, data=make_data)
print("trained:", result.summary["val_acc"], result.run_id)

space = {"name": "notebook-digits", "train": config,
         "params": {"optim.lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}}
found = triaccel.search(space, model=make_model, data=make_data, trials=4)
print("searched:", found.best_config["optim"]["lr"], found.ratio, found.run_ids)
