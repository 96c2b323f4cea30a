"""``botmesh console``: a web page for the operators of one topic prefix, server-rendered
(aiohttp, every value escaped with ``html.escape``, inline CSS, an inline SVG chart, no
script: every page and form works without JavaScript).

==========  ===========================================================================
module      what it holds
==========  ===========================================================================
``server``  the aiohttp app, its routes, who may act (``ConsoleConfig``, ``Console``,
            ``serve``, ``serving``)
``index``   what the console keeps from following its topics: each chat's journal
            records, receipts and dead letters; the campaigns' sends and the
            scheduled sends; the counters over time (``Index``)
``auth``    the operators' tokens, the sessions a sign-in opens, their CSRF tokens
``pages``   each page as HTML from the data gathered
``render``  the HTML pieces: escaping, tables, forms, the chart, the page frame
==========  ===========================================================================

The index is filled in the background by a ``botmesh.streams.ops.tail.Follower`` reading
``<prefix>.worker-journal-changelog``, ``<prefix>.sent``, the three dead-letter topics and
``<prefix>.metrics`` from their start and then following them; each page says how far it
has read (``index-progress``).

Routes
------

==========================  ====================================================
``GET /``                   the overview: workers (instance id, partitions, ready or
                            restoring), lag per partition, dead letters by kind and
                            reason, ambiguous sends, scheduled sends and campaigns in
                            progress, sends parked per retry tier, the counters over
                            time (``?counter=NAME``, repeatable)
``GET /timeline``           a chat's timeline (``?chat_id=ID``)
``GET /campaigns``          the campaigns (newest first: their sends' counts by state and
                            their progress) and the sends scheduled for later (soonest
                            first, the first 500, with how many more)
``GET /dead-letters``       the dead letters (``?kind=&reason=&chat_id=&key=&since=&until=``)
``POST /dead-letters/action``  ``command`` (retry, replay, discard) on the dead letters
                            the filter fields pick; without ``confirm=yes`` a dry run
                            (with the confirmation form), with it the owners' answers
``GET /replay``             the offsets ``botmesh replay`` would set (``?mode=from-offset|
                            from-time|to-earliest&value=&topic=&partition=``), with its
                            refusals; changes nothing
``GET /login``, ``POST /login``   sign in with a token (sets the session cookie)
``POST /logout``            sign out
``GET /healthz``            ``ok``
==========================  ====================================================

Element ids for tests (``data-testid``; ``data-*`` attributes carry the values)
-------------------------------------------------------------------------------

Every page: ``nav-overview``, ``nav-timeline``, ``nav-campaigns``, ``nav-dead-letters``,
``nav-replay``, ``nav-login`` (signed out, actions on), ``whoami`` and ``logout`` (signed
in), ``readonly-banner`` (read-only, with why), ``index-progress``, ``error``.

Overview: ``group-state``; ``workers`` (the table), ``worker-row`` (``data-instance``)
with ``worker-instance``, ``worker-partitions``, ``worker-status`` (``data-status``:
``ready``, ``restoring``, ``not ready``, ``unknown``); ``lags``, ``total-lag``,
``lag-cell`` (``data-topic``: ``inbound`` or ``requests``, ``data-partition``);
``dead-counts``, ``dead-count`` (``data-kind``, ``data-reason``); ``ambiguous-count``;
``parked-count`` (``data-tier``); ``overview-scheduled`` (sends scheduled for later),
``overview-campaigns`` (campaigns with a send pending); ``counters-chart`` (the SVG),
``counter-series`` (``data-counter``), ``counters-form``, ``counters``, ``counter-row``
(``data-counter``).

Timeline: ``timeline-form``, ``timeline-chat`` (the input), ``timeline-submit``;
``timeline`` (``data-chat``), ``timeline-empty``; ``timeline-entry`` (``data-kind``:
``inbound``, ``send``, ``flow``, ``dead-letter``, ``receipt``; ``data-state``;
``data-id`` of an inbound, ``data-key`` of a send) with ``inbound-state``,
``entry-text`` (the text, or ``hidden (N chars)``), ``dead-reason``, and for a send
``send-key``, ``send-state``, ``send-attempts``, ``send-message-id``, ``send-receipt``
(``data-state``), ``send-dead-reason`` (``expired``: its deadline passed first),
``send-at`` (``data-at``: when a scheduled send goes out, epoch seconds),
``send-deadline`` (``data-deadline``); for a flow ``flow-checkpoint``, ``flow-status``.

Campaigns: ``campaigns`` (the table), ``campaign-row`` (``data-campaign``) with
``campaign-id``, ``campaign-pending``, ``campaign-sent``, ``campaign-dead``,
``campaign-expired``, ``campaign-unknown``, ``campaign-cancelled``, ``campaign-total``,
``campaign-progress`` (``data-settled``, ``data-total``, ``data-percent``) holding
``campaign-bar``; ``scheduled-summary`` with ``scheduled-count`` (every send waiting for a
later time), ``scheduled-more`` (those not listed, only when some are not),
``scheduled-due`` (pending with their time passed); ``scheduled`` (the table),
``scheduled-row`` (``data-key``, ``data-chat``) with ``scheduled-at`` (``data-at``),
``scheduled-deadline``, ``scheduled-chat`` (the link to the chat's timeline),
``scheduled-key``, ``scheduled-state``.

Dead letters: ``dlq-filter`` with ``dlq-filter-kind``, ``dlq-filter-reason``,
``dlq-filter-chat_id``, ``dlq-filter-key``, ``dlq-filter-since``, ``dlq-filter-until``,
``dlq-filter-submit``; ``dlq-table``, ``dlq-row`` (``data-kind``, ``data-key``,
``data-reason``, ``data-chat``, ``data-where``) with ``dlq-headers``, ``dlq-value``;
the action buttons ``dlq-action-retry``, ``dlq-action-discard`` (outbox rows),
``dlq-action-replay`` (inbound rows), and for every row listed ``dlq-bulk-retry``,
``dlq-bulk-discard``, ``dlq-bulk-replay``. None of them in read-only mode or signed out.

An action: ``action-dry-run`` with ``action-plan``, ``action-confirm`` (the button),
``action-cancel``; ``action-result`` with ``action-results``; both with
``action-summary`` and ``action-result-row`` (``data-target``, ``data-outcome``,
``data-state``); ``action-back``. A refused request (401, 403): ``action-refused``.

Replay: ``replay-form`` with ``replay-mode-from-offset``, ``replay-mode-from-time``,
``replay-mode-to-earliest``, ``replay-value``, ``replay-topic-inbound``,
``replay-topic-requests``, ``replay-partition``, ``replay-submit``; ``replay-moves``,
``replay-move`` (``data-topic``, ``data-partition``) with ``replay-current``,
``replay-new``; ``replay-refusal``; ``replay-error``.

Sign in: ``login-form``, ``login-token``, ``login-submit``, ``login-error``.
"""

from botmesh.console.auth import Tokens
from botmesh.console.server import DEFAULT_PORT, Console, ConsoleConfig, serve, serving

__all__ = ["DEFAULT_PORT", "Console", "ConsoleConfig", "Tokens", "serve", "serving"]
