"""Words the demo pool writes and the tiny tokenizers are trained on (e-commerce live streaming)."""

from __future__ import annotations

PRODUCTS = [
    "lipstick",
    "sneaker",
    "backpack",
    "teapot",
    "headphones",
    "jacket",
    "watch",
    "blender",
    "perfume",
    "sunglasses",
    "umbrella",
    "kettle",
    "notebook",
    "lamp",
    "scarf",
    "phone case",
]
COLORS = ["red", "blue", "green", "black", "white", "yellow", "purple", "orange", "pink", "gray"]
ADJECTIVES = [
    "waterproof",
    "lightweight",
    "durable",
    "soft",
    "compact",
    "wireless",
    "organic",
    "classic",
    "limited",
    "premium",
    "portable",
    "handmade",
]
SELLING_POINTS = [
    "free shipping today",
    "buy one get one free",
    "thirty percent off",
    "lifetime warranty",
    "only fifty left in stock",
    "new spring collection",
    "gift box included",
    "vegan leather",
]
SPEAKER_NAMES = ["host", "guest", "assistant host", "brand manager"]

INSTRUCTIONS = [
    "Describe the image in one short sentence.",
    "Read all the text in the image exactly as written.",
    "Convert the table in the image to Markdown.",
    "Give the bounding box of the {product} as [x1, y1, x2, y2].",
    "Find the start and end time in seconds when the {product} is shown.",
    "Split the live stream into product segments with start and end times.",
    "List the selling points the host mentions for the {product}.",
    "Transcribe the speech in the audio.",
    "Separate the speakers and transcribe what each one says.",
    "Summarise what the host says while showing the video.",
    "Write a product title for a {color} {adjective} {product}.",
    "Answer the customer's question about the {product} politely.",
]

_EXTRA_PROSE = [
    "Welcome back to the live room, everyone! Today we have great deals for you.",
    "The price is 199 yuan, and the first 100 orders get a free gift.",
    "Please add the item to your cart before the countdown ends.",
    "The box is at x 120, y 45 to x 310, y 260 in the picture.",
    "From 00:12 to 00:27 the host shows the red sneaker from every side.",
    "| item | price | stock |\n|---|---|---|\n| teapot | 89 | 12 |",
    "Speaker 1: Is it waterproof? Speaker 2: Yes, fully waterproof.",
    "Order number 0123456789 ships tomorrow morning.",
]


def corpus_lines() -> list[str]:
    """A deterministic few thousand lines of text for training the tiny tokenizers."""
    lines = list(_EXTRA_PROSE) + list(INSTRUCTIONS) + list(SELLING_POINTS)
    for i, product in enumerate(PRODUCTS):
        for j, color in enumerate(COLORS):
            adjective = ADJECTIVES[(i + j) % len(ADJECTIVES)]
            point = SELLING_POINTS[(i * 3 + j) % len(SELLING_POINTS)]
            lines.append(f"A {color} {adjective} {product}: {point}. Price {(i + 1) * (j + 3) * 7} yuan.")
            lines.append(f"The {product} is {color}, {adjective}, and {point}.")
    for n in range(0, 1000, 7):
        lines.append(
            f"{n} {n * 3 % 1000} [{n % 640}, {n * 7 % 480}, {(n * 13) % 640}, {(n * 17) % 480}] 00:{n % 60:02d}"
        )
    return lines
