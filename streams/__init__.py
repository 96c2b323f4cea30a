"""The Kafka edge: the Faust app and its agents. The only package that imports Kafka or Faust."""
