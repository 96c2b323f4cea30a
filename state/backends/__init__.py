"""Journal backends behind the ``DurableKv`` SPI, picked by URL."""
