"""modelcut's local web app: the pipeline animation, the layout explorer and the published runs.

``create_app()`` (in :mod:`modelcut.web.app`) builds the FastAPI application; ``modelcut serve``
runs it with uvicorn. Every script and style is served from ``static/``: no network, no build step.
"""
