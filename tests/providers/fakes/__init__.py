"""Local fakes of the channels' HTTP APIs: aiohttp servers on 127.0.0.1 that answer as the
real APIs do (status codes, rate-limit headers, error bodies, text limits, media), and
remember what they accepted so a test can count the replies."""
