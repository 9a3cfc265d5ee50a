"""Plain English text the tiny model's tokenizer is trained on. Written for this project, so
the generated model depends on nothing downloaded. Change it and every tiny model's
files (and so its model_revision) change too."""

CORPUS = """\
The ledger is the oldest database. A merchant in a harbour town wrote down every sale,
every loan and every debt in a book that nobody was allowed to erase. When a number was
wrong, the clerk did not scratch it out; he wrote a new line that corrected it, and the
book kept both. Anyone who wanted to know what the merchant owned could start at the
first page and add up every line until the last one. The answer was always the same.

A river runs slowly through the valley in the summer. In the morning the water is cold
and clear, and small fish gather in the shadow of the bridge. By noon the children from
the village come down to the stones to swim, and their voices carry across the fields.
In the evening the light turns gold, the swallows fly low over the water, and the old
miller sits on the bench outside his door to watch the sun go down behind the hills.

To bake bread you need flour, water, salt and time. Mix the flour with the water and
let it rest for half an hour, then add the salt and the starter. Fold the dough every
thirty minutes for the first two hours, and then leave it alone. When it has grown by
half, shape it gently into a round loaf, cover it, and put it in the cold overnight.
Bake it the next morning in a very hot oven, with a lid for the first twenty minutes.

The night train leaves the capital a little before ten. Passengers find their cabins,
make their beds and read by the small lamps while the city falls behind them. Somewhere
after midnight the train stops at a border station where nobody gets on or off, and a
guard walks along the platform with a lantern. By dawn the landscape has changed: there
are mountains, pine forests, narrow roads and houses with steep roofs and red shutters.

A good question is often more useful than a quick answer. When a system fails, the
first thing to ask is what changed. The second is what the system was supposed to do,
and the third is how we would know if it did. Engineers who write these answers down,
in plain words and with dates, save their colleagues many hours. A short note that says
why a decision was made is worth more than a long document that only says what was done.

The library opens at nine. The reading room is quiet except for the turning of pages
and the soft steps of the librarian, who knows where every book belongs. Students sit
at the long tables with their notebooks, and an old man by the window reads the same
newspaper every day, from the first page to the last. Outside, the rain falls on the
square, and pigeons shelter under the statue of a poet whom nobody remembers anymore.

Counting is harder than it looks. If two people take money from the same account at the
same moment, each of them may see enough money for their own withdrawal, and together
they may take more than there was. The usual cure is to let only one clerk decide, in
order, one request after another. It is slower for a single request, but it is never
wrong, and a bank that is never wrong is worth waiting for.

In the garden the tomatoes are ripe and the beans have climbed to the top of their
poles. The bees move from flower to flower, heavy with pollen, and a blackbird watches
from the fence for worms in the freshly turned soil. There is always something to do:
water the lettuce before the heat of the day, pull the weeds between the rows, tie up
the tall plants before the wind bends them, and pick what is ready before the birds do.

Every story needs a beginning, a middle and an end. At the beginning we meet someone who
wants something. In the middle they try to get it, and things go wrong, again and again,
each time a little worse. At the end they either get what they wanted, or they learn that
they wanted something else all along. Readers forgive many faults in a story, but they
rarely forgive an ending that does not follow from what came before it.

The weather report said that a storm would arrive in the afternoon. The fishermen pulled
their boats higher up the beach and tied them to iron rings in the sea wall. Shopkeepers
took in their signs, and a woman carried her washing in from the line before the first
drops fell. By four o'clock the sky was dark, the waves were white, and the wind was
shaking the windows of every house along the shore. By nine it was over, and the stars
came out above a sea that was suddenly calm again.

Numbers tell you what happened; names tell you who it happened to. A report with one
without the other is only half a report. Keep the names out of the numbers when you
share them, and keep the numbers next to the names when you settle the account. Write
each entry once, sign it, and never change it afterwards. If you must correct it, add a
new entry that says so, and keep the old one where everyone can see it.

She learned to play the piano at the age of seven, on an instrument that had belonged to
her grandmother. Two keys in the upper octave did not work, so she learned to play around
them, and for years she thought every piano sounded a little strange at the top. When she
finally played a good piano in a concert hall, she laughed out loud in the middle of a
scale, and the audience, who did not know why, laughed with her.

The museum keeps its oldest maps in a cool room without windows. Some were drawn by
sailors who had never seen the coasts they described, and they filled the empty corners
with sea monsters, whirlpools and islands that did not exist. Visitors smile at the
mistakes, but the mapmakers were honest in their way: they marked what they had heard,
and they left space for what they did not know. A careful reader can still learn which
harbours were busy, which rivers were deep enough for ships, and which mountain passes
stayed open through the winter.

Our neighbour repairs bicycles in his garage on Saturday mornings. He has a drawer full
of bolts, chains, spokes, brake cables and tiny ball bearings, all sorted by size into
glass jars with handwritten labels. Children bring him punctured tyres and bent wheels,
and he explains every step while he works: find the leak, sand the rubber, apply the
glue, wait a minute, press the patch firmly, check the pressure. He charges nothing,
but he insists that each child tightens at least one bolt by themselves.

Mathematics rewards patience. A proof that seems impossible on Monday may become obvious
on Thursday, after a long walk and a good night of sleep. Prime numbers, triangles,
fractions, equations, probabilities and infinite series all hide surprising connections,
and the pleasure of discovering one never quite fades. Teachers who remember this give
their pupils difficult problems, plenty of paper, and enough quiet to think.

Electricity arrived in the mountain village late, long after the railway and the post
office. For months people switched their new lamps on and off just to watch them glow.
The blacksmith bought an electric grinder, the baker an electric mixer, and the priest
a loudspeaker that nobody liked. Within a year the candles had moved to the back of the
cupboard, kept only for storms, birthdays and the occasional power cut in January.

Thunder rolled across the desert plateau while the caravan waited beside the dry well.
Camels knelt patiently, merchants wrapped their silk and spices in heavy blankets, and
a young guide climbed the highest dune to look for the lightning. Rain in the desert is
rare and violent; within an hour the empty riverbed might become a roaring torrent,
and within a day it would be sand again, with purple flowers opening everywhere.

Software engineers argue endlessly about tabs, spaces, frameworks, databases, queues,
caches, compilers, containers and deployment pipelines. Experienced ones argue less.
They measure before they optimise, they test the behaviour users depend upon, they keep
their modules small, and they write logs that a tired colleague can read at three in the
morning. Reliability is mostly the accumulation of many boring, deliberate habits.

Autumn brings mushrooms to the beech woods behind the farm. Grandfather knows which ones
are edible and which are poisonous, and he taught everybody never to guess. Chanterelles
are yellow and smell faintly of apricots; porcini have thick stems and brown caps; the
beautiful red ones with white spots are dangerous. Baskets fill slowly, boots get muddy,
and supper that evening is an omelette with butter, parsley, garlic and black pepper.

Astronomers photograph galaxies whose light departed millions of years ago. Telescopes
on distant volcanic summits, cooled and shielded from vibration, collect faint photons
through entire winter nights. Afterwards computers combine thousands of exposures,
subtract noise, correct for atmospheric turbulence, and reveal spiral arms, glowing
nebulae, exploding stars and quiet, ancient clusters orbiting their enormous neighbours.

Hospital kitchens prepare hundreds of meals every day, each labelled for a particular
patient: soft food, no salt, extra protein, vegetarian, gluten free, or nothing at all
before surgery. Cooks begin before sunrise, porters deliver trays along corridors that
smell of soap and coffee, and dietitians check the lists twice. Mistakes are rare because
everybody follows the same written procedure, and because anyone may stop the line.

Questions and answers:
What is the capital of the country? The capital is a city on the river, with a castle.
How many days are in a week? There are seven days in a week.
What colour is the sky on a clear day? The sky is blue on a clear day.
Why do leaves fall in autumn? The trees stop feeding them when the days grow short.
Who keeps the books? The clerk keeps the books, and the auditor reads them.
When does the market open? The market opens at seven and closes at one.
Where is the station? The station is at the end of the long street, past the church.
"""
