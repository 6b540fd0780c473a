"""zmuon.Muon under Lightning (configure_optimizers with a scheduler, automatic optimization with
its closure) and HF transformers' Trainer(optimizers=(opt, sched)) on a tiny randomly initialized
GPT-2: a few steps each, the loss finite and falling.

Run by ctest with the venv's python (.venv, made by .ci/deps --tests); nothing is downloaded.
"""

import logging
import math
import os
import tempfile
import unittest
import warnings

import torch

import zmuon

torch.set_num_threads(2)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config)


def gpt2_groups(model):
    """GPT-2's embeddings are 'wte' and 'wpe' (tied to lm_head): AdamW, not the default rule's
    Muon."""
    return {n: "adamw" for n, _ in model.named_parameters() if ".wte." in n or ".wpe." in n}


def token_rows(n, length=17, vocab=64):
    """Rows of an easy pattern (each token is the previous + 1), for a loss that falls fast."""
    g = torch.Generator().manual_seed(1)
    starts = torch.randint(0, vocab, (n, 1), generator=g)
    return (starts + torch.arange(length)) % vocab


class Lightning(unittest.TestCase):

    def test_configure_optimizers_with_a_scheduler(self):
        import lightning as L
        logging.getLogger("lightning").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")

        losses = []

        class Module(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.model = tiny_gpt2()

            def training_step(self, batch, _):
                (tokens,) = batch
                loss = self.model(input_ids=tokens, labels=tokens).loss
                losses.append(loss.item())
                return loss

            def configure_optimizers(self):
                opt = zmuon.Muon(self.named_parameters(), lr=0.02, adam_lr=3e-3,
                                 groups={f"model.{n}": g for n, g in
                                         gpt2_groups(self.model).items()})
                sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=12)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched,
                                                           "interval": "step"}}

        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(token_rows(96)),
                                           batch_size=8)
        module = Module()
        trainer = L.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(module, data)
        opt = trainer.optimizers[0]
        print(f"Lightning: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
              f"lr {opt.param_groups[0]['lr']:.2e}, last step {opt.last_step['step']}")
        self.assertEqual(opt.last_step["step"], 12)
        self.assertTrue(all(math.isfinite(x) for x in losses))
        self.assertLess(sum(losses[-3:]) / 3, sum(losses[:3]) / 3)
        self.assertLess(opt.param_groups[0]["lr"], 0.02)  # the scheduler ran


class HuggingFaceTrainer(unittest.TestCase):

    def test_trainer_with_optimizers(self):
        from transformers import Trainer, TrainingArguments
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        warnings.filterwarnings("ignore")

        class Rows(torch.utils.data.Dataset):
            def __init__(self, rows):
                self.rows = rows

            def __len__(self):
                return len(self.rows)

            def __getitem__(self, i):
                return {"input_ids": self.rows[i], "labels": self.rows[i]}

        model = tiny_gpt2()
        opt = zmuon.Muon(model.named_parameters(), lr=0.02, adam_lr=3e-3,
                         groups=gpt2_groups(model))
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1,
                                                  total_iters=12)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, max_steps=12, per_device_train_batch_size=8,
                                     logging_steps=1, save_strategy="no", report_to=[],
                                     use_cpu=True, disable_tqdm=True, seed=0)
            trainer = Trainer(model=model, args=args, train_dataset=Rows(token_rows(96)),
                              optimizers=(opt, sched))
            trainer.train()
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        print(f"HF Trainer: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
              f"last step {opt.last_step['step']}, grad_norm {opt.last_step['grad_norm']:.3f}")
        self.assertEqual(opt.last_step["step"], 12)
        self.assertTrue(all(math.isfinite(x) for x in losses))
        self.assertLess(sum(losses[-3:]) / 3, sum(losses[:3]) / 3)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.02 * 0.1, places=6)


if __name__ == "__main__":
    unittest.main()
