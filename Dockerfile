# botmesh worker image: `docker build -t botmesh .`
# Runs the example echo bot; override the command for your own bot and provider:
#   docker run -e KAFKA_BOOTSTRAP_SERVERS=kafka:9092 botmesh \
#       botmesh worker --app mybot:bot --provider mychannel:provider
# The journal lives on Kafka (a changelog topic); the data volume (BOTMESH_DATA_DIR) keeps
# its RocksDB copy, so a restarted container restores only what it lacks: keep the volume.
# Your bot module goes in /app (the working directory is importable: --app mybot:bot).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KAFKA_BOOTSTRAP_SERVERS=kafka:9092 \
    BOTMESH_TOPIC_PREFIX=botmesh \
    BOTMESH_DATA_DIR=/var/lib/botmesh

# LICENSE and NOTICE: pyproject.toml's license-files, installed into botmesh's dist-info
COPY pyproject.toml README.md* LICENSE NOTICE /src/
COPY botmesh /src/botmesh
RUN pip install /src && rm -rf /src \
    && useradd --system --uid 10001 --home-dir /var/lib/botmesh --create-home botmesh
WORKDIR /app
USER botmesh
VOLUME ["/var/lib/botmesh"]

# SIGTERM stops the worker cleanly (the batch in progress finishes, offsets are committed).
STOPSIGNAL SIGTERM
CMD ["botmesh", "worker", "--app", "botmesh.examples.echo_bot:bot"]
