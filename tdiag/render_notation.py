"""The papers' notation as DOT attributes: how each kind of tensor, a summed-away leg's all-ones
vector and a scaled term are drawn, and the symbols of Greek-named tensors and of the maps."""

NODE_STYLE = {
    "input": 'shape=circle style=filled fillcolor="#cfe2f3"',
    "mask": 'shape=circle style=filled fillcolor="#f4cccc"',
    "param": "shape=circle style=solid",
    "const": 'shape=doublecircle style=filled fillcolor="#eeeeee"',
    "random": "shape=circle style=dashed",
    "buffer": 'shape=circle style=filled fillcolor="#fff2cc"',
    "derived": 'shape=circle style=filled fillcolor="#d9ead3"',
}
ONES_STYLE = 'shape=circle width=0.22 fixedsize=true fontsize=9 style=filled fillcolor="#eeeeee" label="1"'
SCALED = "dashed color=gray60"  # the cluster of a scaled, subtracted or dividing term
OPEN_END_STYLE = 'shape=point style=invis width=0.01 label=""'

GREEK = {  # a tensor named after a Greek letter is drawn with the letter, as the papers write it
    name: chr(code)
    for name, code in {
        "alpha": 0x3B1,
        "beta": 0x3B2,
        "gamma": 0x3B3,
        "delta": 0x3B4,
        "eps": 0x3B5,
        "epsilon": 0x3B5,
        "eta": 0x3B7,
        "theta": 0x3B8,
        "kappa": 0x3BA,
        "lambda_": 0x3BB,
        "lam": 0x3BB,
        "mu": 0x3BC,
        "nu": 0x3BD,
        "xi": 0x3BE,
        "pi": 0x3C0,
        "rho": 0x3C1,
        "sigma": 0x3C3,
        "tau": 0x3C4,
        "phi": 0x3C6,
        "chi": 0x3C7,
        "psi": 0x3C8,
        "omega": 0x3C9,
    }.items()
}
MAP_LABEL = {
    "exp": "exp",
    "log": "log",
    "relu": "ReLU",
    "elu1": "elu + 1",
    "clamp": "clamp",
    "maximum": "max",
    "minimum": "min",
    "sigmoid": "σ",
    "tanh": "tanh",
    "softplus": "softplus",
    "silu": "SiLU",
    "gelu": "GELU",
    "sin": "sin",
    "cos": "cos",
    "sqrt": "√",
    "abs": "|·|",
}
