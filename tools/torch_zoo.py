"""PyTorch twins of dbrq's model zoo (samples/zoo), and a safetensors reader / writer.

Shared by the scripts that need PyTorch versions of the zoo models:
  tests/models/make_model_goldens.py   the zoo golden files
  tests/int8/make_int8_goldens.py      (through make_model_goldens)
  bench/torch_models.py                the PyTorch side of bench/compare.sh
  tools/train_digits.py                the bundled digits SmallCnn

Run them with Debian's interpreter (/usr/bin/python3: python3-torch 1.13, python3-torchvision
0.14). They are run as scripts from anywhere, so they import this module by putting this folder on
sys.path (relative to their own __file__):

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import torch_zoo

Every model has the module tree and state-dict keys (names and order) of its C++ counterpart, so a
state_dict of one loads into the other with load_state_dict. ResNet-18 at reduced width uses
torchvision's own BasicBlock, _make_layer and forward; MobileNetV2 needs nothing here
(torchvision's class takes width_mult itself). The BERT encoder uses HuggingFace BERT names; the
decoder LM GPT-2's layout (wte, wpe, h.<i>.ln_1 / attn / ln_2 / mlp, ln_f, lm_head); the
GRU classifier is nn.Embedding, nn.GRU and nn.Linear under dbrq's names; the ViT timm's
VisionTransformer names (cls_token, pos_embed, patch_embed.proj, blocks.<i>.norm1 / attn.qkv /
attn.proj / norm2 / mlp.fc1 / mlp.fc2, norm, head). The DenseNet (samples/zoo/densenet.h) is
torchvision's DenseNet class itself, at any configuration (densenet()).

The safetensors files are written by hand (Debian has no safetensors package): an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, the raw bytes.
"""

import json
import math
import struct
import types

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torchvision.models.resnet import BasicBlock, ResNet

# ---------------------------------------------------------------------------------------------
# safetensors

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.int64: "I64", torch.uint8: "U8",
                      torch.int8: "I8", torch.int32: "I32"}
_FROM_NAME = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """tensors: iterable of (name, tensor), written in that order; metadata: str -> str, stored as
    the header's "__metadata__" (first) unless None."""
    header = {} if metadata is None else {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        if t.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        a = t.numpy()
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()  # the format is little-endian
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Readers may expect the data to start 8-byte aligned; the format pads the header with spaces.
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """name -> tensor for every tensor of the file (the metadata is dropped)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        lo, hi = h["data_offsets"]
        buf = bytearray(raw[8 + n + lo:8 + n + hi])
        out[name] = torch.frombuffer(buf, dtype=_FROM_NAME[h["dtype"]]).reshape(h["shape"]).clone()
    return out


# ---------------------------------------------------------------------------------------------
# ResNet-18 (samples/zoo/resnet.h)


class ResNet18W(ResNet):
    """torchvision's ResNet-18 with the base width (64) as a parameter."""

    def __init__(self, base_width=64, num_classes=1000):
        nn.Module.__init__(self)
        # The attributes torchvision's _make_layer reads.
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = base_width
        self.dilation = 1
        self.groups = 1
        self.base_width = 64  # BasicBlock insists on 64; it is not the channel count
        w = base_width
        self.conv1 = nn.Conv2d(3, w, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(BasicBlock, w, 2)
        self.layer2 = self._make_layer(BasicBlock, 2 * w, 2, stride=2)
        self.layer3 = self._make_layer(BasicBlock, 4 * w, 2, stride=2)
        self.layer4 = self._make_layer(BasicBlock, 8 * w, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * w, num_classes)


# ---------------------------------------------------------------------------------------------
# the BERT-style encoder (samples/zoo/bert_encoder.h); c is its configuration dict


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embeddings = nn.Embedding(c["max_position"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], dtype=torch.long)
        token_types = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.num_heads = c["num_heads"]
        self.head_size = h // self.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dropout = nn.Dropout(0.1)
        # The two attention matmuls; bench/torch_models.py swaps in a oneDNN one
        # (set_attention_matmul). A plain attribute: not part of the state dict.
        self.matmul = torch.matmul

    def split_heads(self, x):
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, hidden):
        q = self.split_heads(self.query(hidden))
        k = self.split_heads(self.key(hidden))
        v = self.split_heads(self.value(hidden))
        scores = self.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = self.dropout(torch.softmax(scores, -1))
        context = self.matmul(probs, v).permute(0, 2, 1, 3)
        return context.reshape(hidden.shape[0], hidden.shape[1], self.num_heads * self.head_size)


class BertResidualOutput(nn.Module):
    """HuggingFace's BertSelfOutput / BertOutput."""

    def __init__(self, in_features, c):
        super().__init__()
        self.dense = nn.Linear(in_features, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertResidualOutput(c["hidden_size"], c)

    def forward(self, hidden):
        return self.output(self.self(hidden), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])
        self.intermediate_act_fn = nn.GELU()

    def forward(self, hidden):
        return self.intermediate_act_fn(self.dense(hidden))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertResidualOutput(c["intermediate_size"], c)

    def forward(self, hidden):
        attended = self.attention(hidden)
        return self.output(self.intermediate(attended), attended)


class BertLayerStack(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_layers"])])

    def forward(self, hidden):
        for layer in self.layer:
            hidden = layer(hidden)
        return hidden


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertLayerStack(c)

    def forward(self, input_ids):
        return self.encoder(self.embeddings(input_ids))


# ---------------------------------------------------------------------------------------------
# the decoder-only LM (samples/zoo/decoder_lm.h); c is its configuration dict


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a key/value cache (past: (key, value) or None, each
    [N, heads, past, head_dim]). The C++ model computes one query row at a time over the visible keys;
    here the standard form: all rows at once with the future positions masked to -inf before softmax.
    The two are the same function (exp(-inf) = 0)."""

    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.num_heads = c["num_heads"]
        self.head_dim = d // self.num_heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        # The two attention matmuls; bench/torch_models.py may swap in a oneDNN one. Not in the state dict.
        self.matmul = torch.matmul

    def split_heads(self, x):
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x, past=None):
        n, s = x.shape[0], x.shape[1]
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        v = self.split_heads(self.v_proj(x))
        if past is not None:
            k = torch.cat([past[0], k], 2)
            v = torch.cat([past[1], v], 2)
        total = k.shape[2]
        scores = self.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if s > 1:
            # query i (position total - s + i) sees keys 0 .. total - s + i
            future = torch.ones(s, total, dtype=torch.bool).triu(total - s + 1)
            scores = scores.masked_fill(future, float("-inf"))
        context = self.matmul(torch.softmax(scores, -1), v).permute(0, 2, 1, 3)
        return self.out_proj(context.reshape(n, s, self.num_heads * self.head_dim)), (k, v)


class DecoderMlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc_in = nn.Linear(c["d_model"], c["d_ff"])
        self.act = nn.GELU()  # erf form, as dbrq's GELU("none")
        self.fc_out = nn.Linear(c["d_ff"], c["d_model"])

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x)))


class DecoderBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["d_model"], eps=c["layer_norm_eps"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["d_model"], eps=c["layer_norm_eps"])
        self.mlp = DecoderMlp(c)

    def forward(self, x, past=None):
        a, present = self.attn(self.ln_1(x), past)
        h = x + a
        return h + self.mlp(self.ln_2(h)), present


class DecoderLM(nn.Module):
    """GPT-2 style pre-LayerNorm decoder. forward(ids [N, S], past) -> (logits [N, S, vocab], present),
    past / present: None or one (key, value) pair per layer."""

    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        self.wte = nn.Embedding(c["vocab_size"], c["d_model"])
        self.wpe = nn.Embedding(c["max_positions"], c["d_model"])
        self.h = nn.ModuleList([DecoderBlock(c) for _ in range(c["num_layers"])])
        self.ln_f = nn.LayerNorm(c["d_model"], eps=c["layer_norm_eps"])
        self.lm_head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)

    def forward(self, input_ids, past=None):
        past_len = 0 if past is None else past[0][0].shape[2]
        positions = torch.arange(past_len, past_len + input_ids.shape[1], dtype=torch.long)
        x = self.wte(input_ids) + self.wpe(positions)
        present = []
        for i, block in enumerate(self.h):
            x, kv = block(x, None if past is None else past[i])
            present.append(kv)
        return self.lm_head(self.ln_f(x)), present

    def generate(self, prompt_ids, max_new_tokens, stop_token=-1):
        """DecoderLM::generate: the prompt in one call, then one token per call, greedy (argmax of the
        last position's logits, the first index on ties). Returns (tokens, logits [len(tokens), vocab])."""
        tokens, rows = [], []
        x = torch.tensor([list(prompt_ids)], dtype=torch.long)
        past = None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits, past = self(x, past)
                last = logits[0, -1]
                best = int(torch.argmax(last))
                rows.append(last)
                tokens.append(best)
                if best == stop_token:
                    break
                x = torch.tensor([[best]], dtype=torch.long)
        vocab = self.config["vocab_size"]
        return tokens, (torch.stack(rows) if rows else torch.zeros(0, vocab))


# ---------------------------------------------------------------------------------------------
# SmallCnn (samples/zoo/small_cnn.h)


class SmallCnn(nn.Module):
    """Mirror of samples/zoo/small_cnn.cc: same layers, same names, same order."""

    def __init__(self, in_channels=1, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.relu3 = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.pool(self.relu2(self.bn2(self.conv2(y))))
        y = self.relu3(self.conv3(y))
        return self.fc(torch.flatten(self.avgpool(y), 1))


# ---------------------------------------------------------------------------------------------
# GruClassifier (samples/zoo/gru_classifier.h)


class GruClassifier(nn.Module):
    """Mirror of samples/zoo/gru_classifier.cc: [B, T] token ids padded with 0 at the end; each
    sequence's length is the number of tokens before its first 0; the GRU runs on the packed
    sequences (each one's recurrence ends at its own length); the head reads the last layer's
    final hidden state."""

    def __init__(self, vocab_size=10000, embedding_dim=128, hidden_size=128, num_layers=2, num_classes=4):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.gru = nn.GRU(embedding_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.classifier = nn.Linear(hidden_size, num_classes)

    @staticmethod
    def lengths_of(ids):
        return (ids != 0).long().cumprod(1).sum(1)

    def forward(self, ids):
        lengths = self.lengths_of(ids)
        steps = int(lengths.max())
        x = self.embedding(ids[:, :steps])
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)
        return self.classifier(h_n[-1])


def gru_classifier_ids(batch, steps, vocab_size, gen):
    """Token ids like zoo's example inputs: non-zero tokens, each row 0-padded after a length drawn
    from [max(1, steps // 4), steps]."""
    ids = torch.zeros(batch, steps, dtype=torch.int64)
    lengths = torch.randint(max(1, steps // 4), steps + 1, (batch,), generator=gen)
    for b in range(batch):
        n = int(lengths[b])
        ids[b, :n] = torch.randint(1, vocab_size, (n,), generator=gen)
    return ids


# ---------------------------------------------------------------------------------------------
# Issue 12 zoo additions: DCGAN generator, U-Net, keyword-spotting Conv1d net
# (samples/zoo/dcgan_generator.h, unet.h, kws_conv1d.h)


class DcganGenerator(nn.Module):
    """Mirror of samples/zoo/dcgan_generator.cc: the DCGAN generator (Radford et al.) for 32x32
    images, as PyTorch's DCGAN example writes it (one nn.Sequential `main`)."""

    def __init__(self, nz=64, ngf=32, nc=3):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(),  # 4x4
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(),  # 8x8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(),  # 16x16
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())  # 32x32

    def forward(self, z):
        return self.main(z)


class UNetDoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))))


class UNetDown(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.conv = UNetDoubleConv(cin, cout)

    def forward(self, x):
        return self.conv(self.pool(x))


class UNetUp(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
        self.conv = UNetDoubleConv(cin // 2 + cout, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], 1))


class UNet(nn.Module):
    """Mirror of samples/zoo/unet.cc: a 3-level U-Net (two 2x down steps, two transposed-conv up
    steps with skip concatenation, 1x1 conv head)."""

    def __init__(self, in_channels=3, num_classes=4, base_width=32):
        super().__init__()
        b = base_width
        self.inc = UNetDoubleConv(in_channels, b)
        self.down1 = UNetDown(b, 2 * b)
        self.down2 = UNetDown(2 * b, 4 * b)
        self.up1 = UNetUp(4 * b, 2 * b)
        self.up2 = UNetUp(2 * b, b)
        self.outc = nn.Conv2d(b, num_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        y = self.up1(x3, x2)
        y = self.up2(y, x1)
        return self.outc(y)


class KwsConv1d(nn.Module):
    """Mirror of samples/zoo/kws_conv1d.cc: keyword spotting on [N, n_mfcc, frames] features."""

    def __init__(self, n_mfcc=40, channels=64, num_classes=12):
        super().__init__()
        c = channels
        self.conv1 = nn.Conv1d(n_mfcc, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm1d(c)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv1d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm1d(c)
        self.relu2 = nn.ReLU()
        self.pool1 = nn.MaxPool1d(2)
        self.conv3 = nn.Conv1d(c, 2 * c, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm1d(2 * c)
        self.relu3 = nn.ReLU()
        self.pool2 = nn.MaxPool1d(2)
        self.conv4 = nn.Conv1d(2 * c, 2 * c, 3, padding=1, bias=False)
        self.bn4 = nn.BatchNorm1d(2 * c)
        self.relu4 = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(2 * c, num_classes)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.pool1(self.relu2(self.bn2(self.conv2(y))))
        y = self.pool2(self.relu3(self.bn3(self.conv3(y))))
        y = self.relu4(self.bn4(self.conv4(y)))
        return self.fc(torch.flatten(self.avgpool(y), 1))
# VisionTransformer (samples/zoo/vit.h); c is its configuration dict (timm's key names)


class PatchEmbed(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = nn.Conv2d(c["in_channels"], c["d_model"], c["patch_size"], stride=c["patch_size"])

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class VitAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.num_heads = c["num_heads"]
        self.head_dim = d // self.num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        # The two attention matmuls; bench/torch_models.py may swap in a oneDNN one. Not in the state dict.
        self.matmul = torch.matmul

    def forward(self, x):
        n, t = x.shape[0], x.shape[1]
        qkv = self.qkv(x).reshape(n, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = self.matmul(q, k.transpose(-1, -2)) * self.scale
        context = self.matmul(torch.softmax(scores, -1), v)
        return self.proj(context.permute(0, 2, 1, 3).reshape(n, t, self.num_heads * self.head_dim))


class VitMlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc1 = nn.Linear(c["d_model"], c["mlp_dim"])
        self.act = nn.GELU()  # erf form
        self.fc2 = nn.Linear(c["mlp_dim"], c["d_model"])

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class VitBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm1 = nn.LayerNorm(c["d_model"], eps=c["layer_norm_eps"])
        self.attn = VitAttention(c)
        self.norm2 = nn.LayerNorm(c["d_model"], eps=c["layer_norm_eps"])
        self.mlp = VitMlp(c)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Mirror of samples/zoo/vit.cc: [N, C, S, S] images -> [N, classes] logits. The class token is
    broadcast with expand (dbrq adds it to zeros: the same values)."""

    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        patches = (c["image_size"] // c["patch_size"]) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + patches, d) * 0.02)
        self.patch_embed = PatchEmbed(c)
        self.blocks = nn.ModuleList([VitBlock(c) for _ in range(c["num_layers"])])
        self.norm = nn.LayerNorm(d, eps=c["layer_norm_eps"])
        self.head = nn.Linear(d, c["num_classes"])

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


# ---------------------------------------------------------------------------------------------
# helpers


def randomize_norms(model, gen, num_batches_tracked=None):
    """Gives every BatchNorm / LayerNorm non-trivial statistics and affine parameters, drawn from
    `gen`, so no norm is an identity. BatchNorm's num_batches_tracked is set to
    `num_batches_tracked`, or drawn from `gen` too (1..999) when that is None."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
                count = num_batches_tracked
                if count is None:
                    count = int(torch.randint(1, 1000, (1,), generator=gen))
                m.num_batches_tracked.fill_(count)
            elif isinstance(m, nn.LayerNorm):
                shape = m.weight.shape
                m.weight.copy_(torch.rand(shape, generator=gen) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(shape, generator=gen) * 0.1)


# ---------------------------------------------------------------------------------------------
# DenseNet (samples/zoo/densenet.h): torchvision's class has the same modules and keys.


def densenet(growth_rate=32, block_config=(6, 12, 24, 16), num_init_features=64, bn_size=4, num_classes=1000):
    """torchvision's DenseNet (DenseNet-121 with the defaults), no dropout."""
    from torchvision.models.densenet import DenseNet
    return DenseNet(growth_rate=growth_rate, block_config=tuple(block_config), num_init_features=num_init_features,
                    bn_size=bn_size, drop_rate=0, num_classes=num_classes)


# FX 1.13 cannot trace the decoder's shape-dependent factories (arange, and `if s > 1` on a traced
# size): a forward computing the same function with positions and the causal mask derived from the
# data (cumsum of ones), which traces (bench/qconfig_table.py, tools/train_text_lm.py).
def positions_of(ids):
    return torch.cumsum(torch.ones_like(ids), 1) - 1


def causal_attention_forward(self, x):
    n, s = x.shape[0], x.shape[1]
    q = self.split_heads(self.q_proj(x))
    k = self.split_heads(self.k_proj(x))
    v = self.split_heads(self.v_proj(x))
    scores = self.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
    idx = torch.cumsum(torch.ones_like(x[0, :, 0]), 0)
    scores = scores.masked_fill(idx[None, :] > idx[:, None], float("-inf"))
    context = self.matmul(torch.softmax(scores, -1), v).permute(0, 2, 1, 3)
    return self.out_proj(context.reshape(n, s, self.num_heads * self.head_dim)), None


class DecoderLogits(torch.nn.Module):
    """DecoderLM's logits for a prompt with an empty cache (dbrq's zoo `run`), FX-traceable: the same function
    and the same state-dict keys (under lm.) with positions and the causal mask derived from the data."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        for block in lm.h:
            block.attn.forward = types.MethodType(causal_attention_forward, block.attn)

    def forward(self, input_ids):
        x = self.lm.wte(input_ids) + self.lm.wpe(positions_of(input_ids))
        for block in self.lm.h:
            h = x + block.attn(block.ln_1(x))[0]
            x = h + block.mlp(block.ln_2(h))
        return self.lm.lm_head(self.lm.ln_f(x))
