# botmesh worker image: `docker build -t botmesh .`
# Runs the example echo bot; override the command for your own bot and provider:
#   docker run -e KAFKA_BOOTSTRAP_SERVERS=kafka:9092 botmesh \
#       botmesh worker --app mybot:bot --provider mychannel:provider
# The journal is a file in the data volume (BOTMESH_DATA_DIR/journal): keep the volume.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KAFKA_BOOTSTRAP_SERVERS=kafka:9092 \
    BOTMESH_TOPIC_PREFIX=botmesh \
    BOTMESH_DATA_DIR=/var/lib/botmesh

WORKDIR /app
COPY pyproject.toml README.md* ./
COPY botmesh ./botmesh
COPY streams ./streams
COPY topics ./topics
COPY state ./state
COPY providers ./providers
COPY examples ./examples
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /var/lib/botmesh --create-home botmesh
USER botmesh
VOLUME ["/var/lib/botmesh"]

# SIGTERM stops the worker cleanly (the batch in progress finishes, offsets are committed).
STOPSIGNAL SIGTERM
CMD ["botmesh", "worker", "--app", "examples.echo_bot:bot"]
