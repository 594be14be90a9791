"""Past one machine: N engine replicas as a Ray Serve deployment behind the same OpenAI API.

    policy.py         the routing decision in tokens and prefixes (no Ray; unit-tested on plain data)
    router.py         Ray Serve's RequestRouter shell around it
    autoscale.py      the queued-tokens autoscaling policy
    fleet.py          the board where replicas post their stats (for /metrics and /health)
    remote_engine.py  the front end's Engine over a deployment handle (retries, replica faults)
    app.py            the deployments: engine replicas and the OpenAI front end
    launch.py         ``hybridllm-cloud serve --replicas N``: Ray up, app up, wait, clean up

Importing this package imports nothing; ``app``, ``router`` and ``launch.start`` import Ray.
"""
