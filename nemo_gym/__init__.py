"""NeMo Gym shaped framework for RL environment servers that keep their sessions across uvicorn workers."""

SESSION_ID_KEY = "session_id"
