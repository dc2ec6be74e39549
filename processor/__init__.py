"""processor: durable, event-sourced pipelines on Kafka with RocksDB projections."""

__version__ = "0.1.0"
