"""Layout recommendations (issue 22, item 2): search layouts and engine settings by simulation for
the user's SLOs and GPU budget, say which pool is the bottleneck, how sure the simulator is on the
current layout, and store the answer (``recommendations``). Entry point: :func:`recommend`."""

from analytics.recommend.choose import Recommendation, recommend
from analytics.recommend.inputs import RecommendError, RecommendInputs, SloTarget
from analytics.recommend.search import SearchOptions

__all__ = ["RecommendError", "RecommendInputs", "Recommendation", "SearchOptions", "SloTarget", "recommend"]
