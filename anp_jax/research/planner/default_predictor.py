"""The planner's default predictor of a pilot's steps to target at other batch sizes.

What the planner does with one pilot (`inputs.load_pilot`) when neither ``--predictor`` nor
``--b_crit_factor`` is given: ``DEFAULT['predictor']`` with ``DEFAULT['parameters']`` of that
predictor (`predictors`). The parameters of every predictor are kept, calibrated on the same
tasks, so that scoring scripts and registrations read one source. ``DEFAULT['heldout']`` is how the default compared with the
baselines on held-out tasks: the plan prints it. ``DEFAULT['decided_by']`` says what set it.

Written by ``experiments/plan_validation_heldout.py --apply_decision`` (a registration's
decision rule applied to its scored held-out tasks); change it only through that command, or by
hand in a commit that says why.
"""

DEFAULT = {'predictor': 'constant',
 'parameters': {'factor': {'factor': 1.746, 'log_sd': 0.1757, 'tasks': 6},
                'pollux': {},
                'near_crossing': {'factor': 1.398, 'log_sd': 0.5031, 'tasks': 6},
                'constant': {'b_crit': 496.4, 'log_sd': 0.2843, 'tasks': 6},
                'power_law': {'alpha': 0.6879, 'sd': 0.1325, 'tasks': 6},
                'perfect': {}},
 'calibration': 'the held-out tasks a-f of the plan_validation preset (6 generated tasks, the '
                "linear rule's rates; experiments/results/plan_validation/heldout/)",
 'heldout': 'On the registered held-out tasks (plan_validation:g, plan_validation:h, '
            'plan_validation:i, plan_validation:j, plan_validation:k, plan_validation:l, '
            'plan_validation:m; validation split): median |error| >= 8.2 %, worst >= 55.0 %, '
            'inside its 90 % band 27/34 [62, 91] % (6 predictors ranked); the best predictor '
            "that reads the noise scale (B_crit = k' x B_simple near the crossing): median "
            '|error| >= 7.4 %, worst >= 42.4 %, inside its 90 % band 31/33 [80, 99] %; B_crit '
            '= k x B_noise: median |error| >= 7.6 %, worst >= 74.5 %, inside its 90 % band '
            "27/34 [62, 91] %; paired, B_crit = k' x B_simple near the crossing closer by +0.7 "
            "points of |error| [-2.0, +3.5] over tasks; the pilot's noise scale added nothing "
            "shown over it: the plan rests on the pilot's steps and this baseline. "
            'near_crossing ranks first, but its paired advantage over the best baseline '
            '(constant) is not shown (95 % interval over tasks -2.0 to +3.5 points): the '
            'simpler constant becomes the default.',
 'decided_by': 'experiments/registrations/plan_heldout_2.json (sha256 3cd4b1f7c4f2), applied '
               '2026-12-06 by experiments/plan_validation_heldout.py --apply_decision'}
