"""How work is executed: process pools, queues and the messages between them."""
